from cuda_l1.cli import main

main()
