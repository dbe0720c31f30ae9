// trit_wgmma: y[M, N] = x[M, K] @ W.T for a ternary W in the load-time "mma" layout, on Hopper's
// warpgroup MMA (wgmma.mma_async, sm_90a). Compiled after common.cuh, mma.cu (its decode and cp.async
// helpers) and the wgmma wrappers that trit/kernels/cuda/wgmma.py writes for each token width.
//
// The product is turned around as in trit_mma (y.T = W @ x.T): a warpgroup's four warps each decode the A
// fragment of one 16-row tile of the mma layout into registers (the register A operand of wgmma has the
// m16n8k16 fragment's layout, warp w holding rows 16w to 16w + 15), and NTOK tokens of x are the B
// operand, read by the tensor cores from shared memory through a descriptor. x is staged in the
// 128-byte swizzle: a chunk's inputs in atoms of 64 (128 bytes a token), an atom NTOK * 128 bytes, the
// 16-byte piece c of token n's row at piece c ^ (n % 8). A warp then copies whole 512- or 256-byte runs
// of a token's inputs (coalesced) and its shared-memory writes meet no bank conflicts.
//
// Each k16 step decodes into one of AB register buffers while the wgmmas of the AB - 1 steps before it
// run (wgmma.wait_group AB - 1 before a buffer is written again). A stage is refilled two chunks after it
// was read (the barrier at each chunk's start finds every wgmma of the chunk before the last one retired:
// a chunk has 8 KI >= AB steps), so the tensor cores never drain at a chunk's end: ST stages keep ST - 2
// chunks in flight. Split-K as in trit_mma.

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// cp.async and st.shared write through the generic proxy; wgmma reads through the async proxy
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// The shared-memory matrix descriptor of a K-major operand in the 128-byte swizzle (bits 0-13: address / 16,
// 16-29: LBO / 16 (unused: a k16 step lies inside one atom), 32-45: SBO / 16 = 1024 bytes between 8-token
// groups, 62-63: swizzle mode 1). The atoms start on 1024-byte boundaries; a step's address is its atom's
// plus 32 bytes a k16 step within it, as the swizzle is applied to the address bits.
__device__ __forceinline__ unsigned long long smem_desc_sw128(u32 addr) {
    return (unsigned long long)((addr & 0x3FFFF) >> 4) | (1ull << 16) | ((unsigned long long)(1024 >> 4) << 32) |
           (1ull << 62);
}

// NTOK: tokens a block (the wgmma's N: 16 to 256; blockIdx.z picks the slice of tokens); RT: 16-row tiles a
// warp (RT wgmmas a k16 step); KI: 128-input steps a chunk; GS: inputs a scale (0: one a row); ST: pipeline
// stages (3 or more); NW: warps a block (whole warpgroups; the x copy's passes hold whole 8-token groups);
// AB: A-register buffers (2 or 4: wgmma groups in flight behind the decode).
template <int NTOK, int RT, int KI, int GS, int ST, int NW, int AB>
__global__ void __launch_bounds__(NW * 32) trit_wgmma(const U4* __restrict__ wq, const u32* __restrict__ sc,
                                                  const u16* __restrict__ x, u16* __restrict__ y,
                                                  float* __restrict__ ws, int* __restrict__ locks, int M, int N,
                                                  int K, int KS, int GP, int chunks_per_split, int splits) {
    constexpr int KC = KI * 128;                      // inputs a chunk
    constexpr int NTH = NW * 32;
    static_assert(NW % 4 == 0 && NTH % KC == 0, "whole warpgroups, and whole 8-token groups of x a pass");
    constexpr int NGC = GS == 0 ? 1 : (KC / GS);      // scale groups a chunk
    constexpr int WPG = GS == 0 ? 1 << 30 : GS / 32;  // words a scale group (GS >= 32)
    static_assert(2 * NGC <= 32, "a warp's lanes copy a chunk's scales: two 16-byte pieces a group");
    constexpr int X_BYTES = NTOK * KC * 2;
    constexpr int W_BYTES = NW * RT * KI * 512;
    constexpr int S_BYTES = GS == 0 ? 0 : NW * RT * NGC * 32;
    constexpr int STAGE = (X_BYTES + W_BYTES + S_BYTES + 1023) / 1024 * 1024;  // atoms on 1024-byte boundaries
    static_assert(ST >= 3, "a stage is refilled two chunks after it was read");
    static_assert((AB == 2 || AB == 4) && (8 * KI) % AB == 0, "the buffers cycle over a chunk's k16 steps");
    extern __shared__ __align__(128) unsigned char smem[];  // [ST][x | codes | scales], from a 1024-byte boundary

    {  // this block's slice of tokens
        const int m0 = blockIdx.z * NTOK;
        x += (long)m0 * K;
        y += (long)m0 * N;
        ws += (long)m0 * N;
        locks += blockIdx.z * gridDim.x;
        M = min(M - m0, NTOK);
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int NT = (N + 15) >> 4;
    const int tile0 = (blockIdx.x * NW + warp) * RT;
    const int nchunks = (KS + KI - 1) / KI;
    const int c0 = blockIdx.y * chunks_per_split;
    const int c1 = min(nchunks, c0 + chunks_per_split);
    const u32 mask = 0x00030003u | (u32)(M >> 30);
    const u32 base = (smem_addr(smem) + 1023) & ~1023u;

    float acc[RT][NTOK / 2];
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
        for (int e = 0; e < NTOK / 2; ++e) acc[r][e] = 0.f;

    u32 row_scale[RT];
#pragma unroll
    for (int r = 0; r < RT; ++r)
        row_scale[r] = (GS == 0 && tile0 + r < NT) ? ldg32(sc + (long)(tile0 + r) * GP * 8 + g) : 0u;

    // x: thread T copies the 16-byte piece kc = T % (KC / 8) of tokens T / (KC / 8) + p RPP (p < XP), to atom
    // kc / 8, piece (kc % 8) ^ (token % 8): RPP is a multiple of 8, so the piece is the same in every pass.
    constexpr int CPR = KC / 8, RPP = NTH / CPR, XP = NTOK / RPP;
    static_assert(RPP % 8 == 0 && NTOK % RPP == 0 && XP >= 1 && XP <= 32, "passes of the x copy cover NTOK");
    const int kc = threadIdx.x % CPR, n0 = threadIdx.x / CPR, kv = kc * 8;
    const u32 x_off = (kc / 8) * NTOK * 128 + n0 * 128 + (((kc % 8) ^ (n0 & 7)) * 16);
    u32 xlive = 0;
#pragma unroll
    for (int p = 0; p < XP; ++p) {
        const int row = n0 + p * RPP;
        if (row < M) xlive |= 1u << p;
        else
#pragma unroll
            for (int st = 0; st < ST; ++st)
                asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};" ::"r"(base + st * STAGE + x_off + p * RPP * 128),
                             "r"(0u));
    }
    const u16* xsrc = x + (long)n0 * K + kv + (long)c0 * KC;
    int xk = c0 * KC + kv;
    CODE_SOURCES
    int step = c0 * KI;
    const u32 w_off = X_BYTES + ((warp * RT) * KI * 32 + lane) * 16;
    const u32 s_off = X_BYTES + W_BYTES + ((warp * RT) * NGC * 8 + lane * 4) * 4;

    auto load_stage = [&](int st) {
        const u32 sb = base + st * STAGE;
        const int xbytes = xk < K ? 16 : 0;
#pragma unroll
        for (int p = 0; p < XP; ++p)
            if (xlive & (1u << p))
                cp_async16(sb + x_off + p * RPP * 128, xbytes ? xsrc + (long)p * RPP * K : x, xbytes);
        STAGE_CODES(sb)
        xsrc += KC;
        xk += KC;
        step += KI;
    };

#pragma unroll
    for (int s = 0; s < ST - 2; ++s) {
        if (c0 + s < c1) load_stage(s);
        cp_async_commit();
    }
    u32 a[AB][RT][4];
    int st_use = 0, st_fill = ST - 2;
    for (int c = c0; c < c1; ++c) {
        cp_async_wait<ST - 3>();
        fence_proxy_async();
        __syncthreads();  // chunk c is in; every wgmma of chunk c - 2 (stage st_fill) has retired
        if (c + ST - 2 < c1) load_stage(st_fill);
        cp_async_commit();
        st_fill = st_fill == ST - 1 ? 0 : st_fill + 1;
        const u32 sb = base + st_use * STAGE;
        st_use = st_use == ST - 1 ? 0 : st_use + 1;
#pragma unroll
        for (int i = 0; i < KI; ++i) {
            if (c * KI + i >= KS) break;
            U4 wv[RT];
#pragma unroll
            for (int r = 0; r < RT; ++r) wv[r] = lds128(sb + X_BYTES + (((warp * RT + r) * KI + i) * 32 + lane) * 16);
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const int word = i * 4 + j;
                u32 sw[RT];
#pragma unroll
                for (int r = 0; r < RT; ++r)
                    sw[r] = GS == 0 ? row_scale[r]
                                    : lds32(sb + X_BYTES + W_BYTES + ((warp * RT + r) * NGC * 8 + (word / WPG) * 8 + g) * 4);
#pragma unroll
                for (int s = 0; s < 2; ++s) {
                    const int q = (word * 2 + s) % AB;  // this step's buffer
#pragma unroll
                    for (int r = 0; r < RT; ++r) {
                        const u32 w = j == 0 ? wv[r].x : j == 1 ? wv[r].y : j == 2 ? wv[r].z : wv[r].w;
                        decode(w, s, splat_lo(sw[r]), splat_hi(sw[r]), mask, a[q][r]);
                    }
                    const int kk = i * 128 + j * 32 + s * 16;
                    const unsigned long long d = smem_desc_sw128(sb + (kk / 64) * NTOK * 128 + (kk % 64) * 2);
                    wgmma_fence();
#pragma unroll
                    for (int r = 0; r < RT; ++r) wgmma_bf16<NTOK>(acc[r], a[q][r], d);
                    wgmma_commit();
                    wgmma_wait<AB - 1>();
                }
            }
        }
    }
    wgmma_wait<0>();
    cp_async_wait<0>();

    // accumulator e of a thread: token tile e / 4, as an m16n8 C fragment: row g (+ 8 for e % 4 >= 2),
    // tokens 2t and 2t + 1
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
        for (int e = 0; e < NTOK / 2; ++e) {
            const int n = (tile0 + r) * 16 + g + ((e >> 1) & 1) * 8;
            const int m = (e >> 2) * 8 + 2 * t + (e & 1);
            if (n >= N || m >= M) continue;
            if (splits == 1) y[(long)m * N + n] = f32_to_bf16(acc[r][e]);
            else red_add(ws + (long)m * N + n, acc[r][e]);
        }
    if (splits > 1) splitk_finish(y, ws, locks, M, N, NW * RT * 16, splits);
}
