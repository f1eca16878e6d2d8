"""What every benchmark result records: the exact command, machine, GPU, driver, versions, date."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import shlex
import sys


def environment() -> dict:
    import torch

    info = {
        "command": " ".join(shlex.quote(a) for a in [os.path.basename(sys.executable)] + sys.argv),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
    }
    if torch.cuda.is_available():
        from cuda_l1.evaluate.device import driver_version

        info.update(
            gpu=torch.cuda.get_device_name(0),
            gpus=torch.cuda.device_count(),
            driver=driver_version(),
            cuda=torch.version.cuda,
        )
        try:
            import triton

            info["triton"] = triton.__version__
        except ImportError:
            pass
    else:
        info["gpu"] = None
    return info
