#!/usr/bin/env python3
"""Link-time stand-ins for the CUDA libraries candle links (cudarc's `dynamic-linking`), made
from cudarc's own bindings: every function cudarc declares, as an empty symbol in a shared
library with the real library's SONAME. The binary records only the SONAMEs; on the GPU
machine the dynamic loader binds them to the real libraries. Never run a program against
these stubs.

usage: stubs.py CUDARC_SRC OUT_DIR
"""
import pathlib
import re
import subprocess
import sys

# (cudarc module, library name the linker looks for, SONAME of CUDA 13.0's library)
LIBS = [
    ("driver", "cuda", "libcuda.so.1"),
    ("nvrtc", "nvrtc", "libnvrtc.so.13"),
    ("cublas", "cublas", "libcublas.so.13"),
    ("cublaslt", "cublasLt", "libcublasLt.so.13"),
    ("curand", "curand", "libcurand.so.10"),
]


def main() -> None:
    src, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    for module, name, soname in LIBS:
        text = (src / module / "sys" / "mod.rs").read_text()
        symbols = sorted(set(re.findall(r"^pub unsafe fn (\w+)\(", text, re.M)))
        if not symbols:
            sys.exit(f"no functions found in cudarc's {module} bindings")
        c_file = out / f"{name}_stub.c"
        c_file.write_text("".join(f"void {s}(void) {{}}\n" for s in symbols))
        lib = out / f"lib{name}.so"
        subprocess.run(
            ["cc", "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", str(lib), str(c_file)],
            check=True,
        )
        print(f"{lib.name}: {len(symbols)} symbols, SONAME {soname}")


if __name__ == "__main__":
    main()
