"""The flag policy as data: which compiler and linker flags are known-harmless, and why the
well-known dangerous ones are refused. `flags.py` applies it (default-deny: what no rule here
allows is refused); a reviewer of the policy reads only this file.
"""

from __future__ import annotations

import re

MAX_FLAGS = 64  # per argument; real candidates use a handful
MAX_FLAG_CHARS = 512

# Libraries an extension may link by name (`-lNAME`); all live in the CUDA toolkit, torch or libc.
ALLOWED_LIBS = frozenset({
    "cublas", "cublasLt", "curand", "cusparse", "cufft", "cusolver", "cudart", "cuda", "nvrtc",
    "nvToolsExt", "cudnn", "c10", "c10_cuda", "torch", "torch_cpu", "torch_cuda", "torch_python",
    "m", "pthread", "dl", "rt", "gomp", "stdc++",
})

# Why a well-known dangerous flag is refused; matched by prefix, checked before the allowlists.
DENIED = (
    ("@", "response files read arbitrary files"),
    ("-fplugin", "compiler plugins run arbitrary code"),
    ("-B", "-B replaces the compiler's own programs"),
    ("-wrapper", "-wrapper runs another program"),
    ("-specs", "spec files rewrite the compiler's commands"),
    ("--specs", "spec files rewrite the compiler's commands"),
    ("-ccbin", "the host compiler is chosen by the build, not the candidate"),
    ("--compiler-bindir", "the host compiler is chosen by the build, not the candidate"),
    ("-Wl,", "linker pass-through can load scripts and plugins"),
    ("-Xlinker", "linker pass-through can load scripts and plugins"),
    ("-Xnvlink", "linker pass-through is not allowed"),
    ("-Wa,", "assembler pass-through is not allowed"),
    ("-Xassembler", "assembler pass-through is not allowed"),
    ("-Wp,", "preprocessor pass-through is not allowed"),
    ("-Xpreprocessor", "preprocessor pass-through is not allowed"),
    ("-save-temps", "outputs are placed by the build"),
    ("-keep", "outputs are placed by the build"),
    ("--keep", "outputs are placed by the build"),
    ("-odir", "outputs are placed by the build"),
    ("--output-directory", "outputs are placed by the build"),
    ("--output-file", "outputs are placed by the build"),
    ("-dump", "outputs are placed by the build"),
    ("-fdump", "outputs are placed by the build"),
    ("-fprofile", "profile files are read and written outside the build"),
    ("--sysroot", "the system root is fixed by the build"),
    ("-isysroot", "the system root is fixed by the build"),
    ("-iprefix", "include prefixes are fixed by the build"),
    ("-iwithprefix", "include prefixes are fixed by the build"),
    ("-fsanitize", "sanitizer runtimes are not linked"),
    ("-flto", "link-time optimisation runs the linker plugin"),
    ("-rdc", "relocatable device code needs a device link step that is not run"),
    ("--relocatable-device-code", "relocatable device code needs a device link step that is not run"),
    ("-dc", "relocatable device code needs a device link step that is not run"),
    ("--dryrun", "the build runs its own commands"),
)
OUTPUT_FLAGS = {"-o", "-E", "-S", "-M", "-MM", "-MD", "-MMD", "-MF", "-MT", "-MQ", "-x", "-T",
                 "-c", "--compile", "-cuda", "--cuda", "-ptx", "--ptx", "-cubin", "--cubin",
                 "-fatbin", "--fatbin", "-link", "--link", "-lib", "--lib", "-run", "--run"}

STD = r"(c|gnu)\+\+(98|03|11|14|17|20|23|26|0x|1y|1z|2a|2b|2c)"
MACRO = re.compile(r"-[DU][A-Za-z_]\w*(=[^\n\r\0]*)?\Z")
CXX_PLAIN = re.compile(
    r"-(O[0-3sgz]?|Ofast|g[0-3]?|ggdb[0-3]?|w|pedantic|pedantic-errors|pthread|fopenmp|fopenmp-simd"
    r"|fPIC|fpic|shared|v|m64|std=" + STD + r")\Z")
CXX_F = re.compile(
    r"-f(no-)?(fast-math|unroll-loops|unroll-all-loops|tree-vectorize|tree-loop-vectorize"
    r"|tree-slp-vectorize|strict-aliasing|math-errno|trapping-math|signed-zeros|finite-math-only"
    r"|associative-math|reciprocal-math|omit-frame-pointer|exceptions|rtti|permissive|inline"
    r"|inline-functions|prefetch-loop-arrays|peel-loops|ipa-pta|function-sections|data-sections"
    r"|plt|var-tracking|semantic-interposition|stack-protector|stack-protector-strong|concepts"
    r"|coroutines|visibility-inlines-hidden|rounding-math|cx-limited-range|builtin|gnu-unique"
    r"|diagnostics-color|elide-constructors|threadsafe-statics|common)\Z"
    r"|-f(fp-contract=(fast|on|off)|visibility=(hidden|default|protected)|max-errors=\d{1,4}"
    r"|vect-cost-model=\w+|inline-limit=\d{1,6}|excess-precision=\w+|template-depth=\d{1,6}"
    r"|constexpr-depth=\d{1,6}|constexpr-steps=\d{1,10}|constexpr-loop-limit=\d{1,10}"
    r"|diagnostics-color=\w+|abi-version=\d{1,3})\Z")
CXX_M = re.compile(
    r"-m(arch|tune|cpu)=[\w.+-]{1,40}\Z"
    r"|-m(no-)?(avx\w*|sse[\w.]*|ssse3|fma|f16c|bmi2?|popcnt|lzcnt|amx-\w+|avx512\w*|vnni\w*"
    r"|prefer-vector-width=\d{2,3}|fpmath=\w+)\Z")
CXX_W = re.compile(r"-W(?![lap],)[\w=+-]{1,80}\Z")

NVCC_PLAIN = re.compile(
    r"-{1,2}(use_fast_math|lineinfo|generate-line-info|G|device-debug|g|debug|expt-relaxed-constexpr"
    r"|expt-extended-lambda|extended-lambda|res-usage|resource-usage|restrict|w|disable-warnings"
    r"|extra-device-vectorization|Wno-deprecated-gpu-targets|Wno-deprecated-declarations|Wreorder"
    r"|Wext-lambda-captures-this|Wdefault-stream-launch|Wmissing-launch-bounds|v|verbose|m64"
    r"|allow-unsupported-compiler|no-host-device-initializer-list|no-host-device-move-forward)\Z")
ARCH = r"(sm|compute|lto)_(5[0-3]|6[0-2]|7[0-5]|8[0-9]|9[0-9]|1[0-3][0-9])[af]?"
ARCH_RE = re.compile(ARCH + r"\Z")
GENCODE = re.compile(r"arch=" + ARCH + r",code=(\[?)(" + ARCH + r")(," + ARCH + r")*\]?\Z")
PTXAS_OK = re.compile(
    r"-{1,2}(v|verbose|O[0-3]|opt-level=[0-3]|warn-spills|warn-on-spills|warn-on-local-memory-usage"
    r"|warn-on-double-precision-use|Werror|suppress-stack-size-warning|allow-expensive-optimizations"
    r"(=(true|false))?|dlcm=c[ag]|dscm=\w+|def-load-cache=\w+|def-store-cache=\w+"
    r"|maxrregcount=\d{1,3}|fmad=(true|false)|register-usage-level=\d{1,2}|disable-optimizer-constants"
    r"|sp-bounds-check|device-debug|lineinfo|generate-line-info)\Z")
CUDAFE_OK = re.compile(r"-{1,2}diag_suppress=[\w,]{1,200}\Z")
BOOL_OPTS = {"ftz", "prec-div", "prec-sqrt", "fmad"}
# nvcc runs its internal steps through /bin/sh with the flags pasted in, so `-DX=$(cmd)` would run
# cmd (plain nvcc does this too). Every nvcc flag must therefore be free of shell syntax.
SHELL_SAFE = re.compile(r"[A-Za-z0-9_=.,:/+\-\[\]@%^]*\Z")
VALUE_FLAGS = {"-I", "-isystem", "-D", "-U", "-L", "-l", "-include"}
