"""CUDA C++ kernels, compiled at first use with NVRTC (:mod:`.nvrtc`); :mod:`.mma` is the tensor-core GEMM."""
