// Shared by the CUDA kernels of the mma layout (mma.cu, gemv.cu): each is compiled as this prelude followed by
// its own file (trit/kernels/cuda/mma.py and gemv.py join them), by NVRTC, with no headers.

typedef unsigned int u32;
typedef unsigned short u16;

struct __align__(16) U4 {
    u32 x, y, z, w;
};

// A code c in bits 0-1 of each half, OR-ed into 128.0 (0x4300), is the bf16 128 + c; minus 129 it is c - 1.
#define ONE 0x3F803F80u
#define M129 0xC301C301u
#define BASE 0x43004300u
#define NEG_ZERO 0x80008000u

__device__ __forceinline__ u32 fma_bf16x2(u32 a, u32 b, u32 c) {
    u32 d;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

__device__ __forceinline__ U4 lds128(u32 addr) {
    U4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
    return v;
}

__device__ __forceinline__ U4 ldg128(const U4* p) {
    U4 v;
    asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

__device__ __forceinline__ u32 ldg32(const u32* p) {
    u32 v;
    asm volatile("ld.global.nc.u32 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
}

__device__ __forceinline__ u32 lds32(u32 addr) {
    u32 v;
    asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(addr));
    return v;
}

__device__ __forceinline__ float lds32f(u32 addr) {
    float v;
    asm volatile("ld.shared.f32 %0, [%1];" : "=f"(v) : "r"(addr));
    return v;
}

__device__ __forceinline__ float bf16_to_f32(u16 v) { return __uint_as_float((u32)v << 16); }

__device__ __forceinline__ void cp_async16(u32 dst, const void* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(src_bytes));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }

template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N));
}

// Rounding activations per 128-input step (trit_gemv, trit_imma): a warp a (step, token), four inputs a lane.
// A warp loads QB jobs' inputs before it rounds any, so that their loads are in flight together (one at a time,
// each job waited a full global-memory latency).
#define QB 4

// Four bf16 inputs of token m from column col (K % 8 == 0: four are all in or all out); zero past M or K.
__device__ __forceinline__ uint2 load_x4(const u16* __restrict__ x, int m, int M, int K, int col) {
    return (m < M && col < K) ? *reinterpret_cast<const uint2*>(x + (long)m * K + col) : make_uint2(0u, 0u);
}

// The lane's four inputs as floats, and the step's scale against the warp's largest: amax < 2^e, so
// x * up < 2^15 with up = 2^(15 - e) (a bf16 that large is an exact integer), x ~= xi * inv with inv = 2^(e - 15).
__device__ __forceinline__ void step_scale(uint2 raw, float (&v)[4], float& up, float& inv) {
    v[0] = __uint_as_float(raw.x << 16), v[1] = __uint_as_float(raw.x & 0xFFFF0000u);
    v[2] = __uint_as_float(raw.y << 16), v[3] = __uint_as_float(raw.y & 0xFFFF0000u);
    float amax = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, o));
    int e = 0;
    frexpf(amax, &e);
    e = max(e, -100);  // a step of tiny values: 2^(15 - e) stays finite (they round to zero)
    up = amax > 0.f ? ldexpf(1.f, 15 - e) : 0.f;
    inv = amax > 0.f ? ldexpf(1.f, e - 15) : 0.f;
}

__device__ __forceinline__ u16 f32_to_bf16(float v) {
    u16 r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(v));
    return r;
}

__device__ __forceinline__ void red_add(float* p, float v) {
    asm volatile("red.global.add.f32 [%0], %1;" ::"l"(p), "f"(v) : "memory");
}

// Split-K, after a block has added its partial sums into the fp32 workspace ``ws`` (red.add): the last of the
// ``splits`` blocks of row block blockIdx.x (a counter a row block in ``locks``) writes the bf16 output of its
// ``block_rows`` rows and zeroes their workspace and its counter, so both are zero again for the next call.
__device__ __forceinline__ void splitk_finish(u16* __restrict__ y, float* __restrict__ ws, int* __restrict__ locks,
                                              int M, int N, int block_rows, int splits) {
    __threadfence();
    __syncthreads();
    __shared__ int last;
    if (threadIdx.x == 0) last = atomicAdd(locks + blockIdx.x, 1) == splits - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    const int n0 = blockIdx.x * block_rows;
    const int rows = min(block_rows, N - n0);
    for (int i = threadIdx.x; i < rows * M; i += blockDim.x) {
        const int m = i / rows, n = n0 + i % rows;
        float* p = ws + (long)m * N + n;
        const float v = __ldcg(p);
        __stcg(p, 0.f);
        y[(long)m * N + n] = f32_to_bf16(v);
    }
    if (threadIdx.x == 0) locks[blockIdx.x] = 0;
}
