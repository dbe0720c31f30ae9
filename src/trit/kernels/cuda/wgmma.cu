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
// Built from its two 32-bit halves: a stage's low word once a chunk, a k16 step's one add to it (the address
// stays below 2^18, so the sum never reaches bit 16), the high word a constant.
__device__ __forceinline__ u32 smem_desc_lo(u32 addr) { return ((addr & 0x3FFFF) >> 4) | (1u << 16); }
__device__ __forceinline__ unsigned long long smem_desc_sw128(u32 lo) {
    unsigned long long d;
    asm("mov.b64 %0, {%1, %2};" : "=l"(d) : "r"(lo), "r"((1024 >> 4) | (1u << 30)));
    return d;
}

// Where a stage's x copy puts the 16-byte piece kc of token row: atom kc / 8 (NTOK rows of 128 bytes), piece
// (kc % 8) ^ (row % 8) of the row, the 128-byte swizzle the descriptors read (wgmma.x_stage_offsets in Python).
template <int NTOK>
__device__ __forceinline__ u32 x_piece(int kc, int row) {
    return (kc / 8) * NTOK * 128 + row * 128 + (((kc % 8) ^ (row & 7)) * 16);
}

// A chunk's k16 steps in stage sb (dlo: its descriptors' low word) for the warp whose tiles are WR within the
// block (trit_wgmma and the consumers of trit_wgmma_ws): for each 128-input step its codes, for each word its tiles' scales, for each half of a word
// the decode into A-register buffer q and the RT wgmmas, committed as one group, then the wait that leaves AB - 1
// groups in flight, then AFTER_WAIT (which may read ``step``, the step's index in the chunk). A macro, as
// CODE_SOURCES in mma.cu: the kernels' SASS stays what it was when each held its own copy.
#define WGMMA_CHUNK(WR, AFTER_WAIT)                                                                               \
    _Pragma("unroll") for (int i = 0; i < KI; ++i) {                                                              \
        if (c * KI + i >= KS) break;                                                                              \
        U4 wv[RT];                                                                                                \
        _Pragma("unroll") for (int r = 0; r < RT; ++r) wv[r] =                                                    \
            lds128(sb + X_BYTES + ((((WR) * RT + r) * KI + i) * 32 + lane) * 16);                                 \
        u32 sw[RT]; /* the scales, read again where a word starts a scale group */                                \
        _Pragma("unroll") for (int j = 0; j < 4; ++j) {                                                           \
            const int word = i * 4 + j;                                                                           \
            _Pragma("unroll") for (int r = 0; r < RT; ++r) if (j == 0 || word % WPG == 0) sw[r] =                 \
                GS == 0 ? row_scale[r]                                                                            \
                        : lds32(sb + X_BYTES + W_BYTES + (((WR) * RT + r) * NGC * 8 + (word / WPG) * 8 + g) * 4); \
            _Pragma("unroll") for (int h = 0; h < 2; ++h) {                                                       \
                const int step = word * 2 + h, q = step % AB; /* this step's buffer */                            \
                _Pragma("unroll") for (int r = 0; r < RT; ++r) {                                                  \
                    const u32 w = j == 0 ? wv[r].x : j == 1 ? wv[r].y : j == 2 ? wv[r].z : wv[r].w;              \
                    decode(w, h, splat_lo(sw[r]), splat_hi(sw[r]), mask, a[q][r]);                                \
                }                                                                                                 \
                const int kk = i * 128 + j * 32 + h * 16;                                                         \
                const unsigned long long d =                                                                      \
                    smem_desc_sw128(dlo + (((kk / 64) * NTOK * 128 + (kk % 64) * 2) >> 4));                       \
                wgmma_fence();                                                                                    \
                _Pragma("unroll") for (int r = 0; r < RT; ++r) wgmma_bf16<NTOK>(acc[r], a[q][r], d);              \
                wgmma_commit();                                                                                   \
                wgmma_wait<AB - 1>();                                                                             \
                AFTER_WAIT                                                                                        \
            }                                                                                                     \
        }                                                                                                         \
    }

// The x copy of trit_wgmma and trit_wgmma_a8 (T: an input's type, EPP inputs a 16-byte piece): thread T copies
// piece kc = T % CPR of tokens T / CPR + p RPP (p < XP), to atom kc / 8, piece (kc % 8) ^ (token % 8): RPP is a
// multiple of 8, so the piece is the same in every pass. Rows past M are zeroed in every stage once, here; xsrc and
// xk are the next chunk's source and its first input. A macro, as WGMMA_CHUNK.
#define WGMMA_X_COPY(T, EPP)                                                                                      \
    constexpr int CPR = KC / (EPP), RPP = NTH / CPR, XP = NTOK / RPP;                                             \
    static_assert(NTH % CPR == 0 && RPP % 8 == 0 && NTOK % RPP == 0 && XP >= 1 && XP <= 32,                       \
                  "passes of the x copy cover NTOK");                                                             \
    const int kc = threadIdx.x % CPR, n0 = threadIdx.x / CPR, kv = kc * (EPP);                                    \
    const u32 x_off = x_piece<NTOK>(kc, n0);                                                                      \
    u32 xlive = 0;                                                                                                \
    _Pragma("unroll") for (int p = 0; p < XP; ++p) {                                                              \
        const int row = n0 + p * RPP;                                                                             \
        if (row < M) xlive |= 1u << p;                                                                            \
        else                                                                                                      \
            _Pragma("unroll") for (int st = 0; st < ST; ++st) asm volatile(                                       \
                "st.shared.v4.u32 [%0], {%1, %1, %1, %1};" ::"r"(base + st * STAGE + x_off + p * RPP * 128),      \
                "r"(0u));                                                                                         \
    }                                                                                                             \
    const T* xsrc = x + (long)n0 * K + kv + (long)c0 * KC;                                                        \
    int xk = c0 * KC + kv;

// The stage ring of trit_wgmma and trit_wgmma_a8, around a kernel's own load_stage(st) and chunk loop over c in
// [c0, c1): WGMMA_RING_FILL loads the first ST - 2 chunks; WGMMA_RING_NEXT, first in the loop, waits for chunk c,
// fences the copies for the async proxy, and behind a barrier (every wgmma of chunk c - 2 has retired) refills the
// stage that chunk read with chunk c + ST - 2, leaving sb (chunk c's stage) and dlo (its descriptors' low word).
// Macros, as WGMMA_CHUNK: each kernel's SASS stays what it was when it held its own copy.
#define WGMMA_RING_FILL                                                                                          \
    _Pragma("unroll") for (int s = 0; s < ST - 2; ++s) {                                                          \
        if (c0 + s < c1) load_stage(s);                                                                           \
        cp_async_commit();                                                                                        \
    }                                                                                                             \
    int st_use = 0, st_fill = ST - 2;
#define WGMMA_RING_NEXT                                                                                          \
    cp_async_wait<ST - 3>();                                                                                      \
    fence_proxy_async();                                                                                          \
    __syncthreads();                                                                                              \
    if (c + ST - 2 < c1) load_stage(st_fill);                                                                     \
    cp_async_commit();                                                                                            \
    st_fill = st_fill == ST - 1 ? 0 : st_fill + 1;                                                                \
    const u32 sb = base + st_use * STAGE, dlo = smem_desc_lo(sb);                                                 \
    st_use = st_use == ST - 1 ? 0 : st_use + 1;

// The accumulators out: accumulator e of a thread is token tile e / 4, as an m16n8 C fragment: row g (+ 8 for
// e % 4 >= 2), tokens 2t and 2t + 1; bf16 into y, or added into the split-K workspace.
#define WGMMA_STORE                                                                                               \
    _Pragma("unroll") for (int r = 0; r < RT; ++r)                                                                \
        _Pragma("unroll") for (int e = 0; e < NTOK / 2; ++e) {                                                    \
            const int n = (tile0 + r) * 16 + g + ((e >> 1) & 1) * 8;                                              \
            const int m = (e >> 2) * 8 + 2 * t + (e & 1);                                                         \
            if (n >= N || m >= M) continue;                                                                       \
            if (splits == 1) y[(long)m * N + n] = f32_to_bf16(acc[r][e]);                                         \
            else red_add(ws + (long)m * N + n, acc[r][e]);                                                        \
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

    TOKEN_SLICE(NTOK)
    BLOCK_COORDS
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

    WGMMA_X_COPY(u16, 8)
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

    WGMMA_RING_FILL
    u32 a[AB][RT][4];
    for (int c = c0; c < c1; ++c) {
        WGMMA_RING_NEXT
        WGMMA_CHUNK(warp, )
    }
    wgmma_wait<0>();
    cp_async_wait<0>();

    WGMMA_STORE
    if (splits > 1) splitk_finish(y, ws, locks, M, N, NW * RT * 16, splits);
}

// ---------------------------------------------------------------------------------------------------------------
// trit_wgmma_ws: the same product, warp-specialized. Warpgroup 0 is the producer: its 128 threads copy each chunk's
// activations, codes and scales into the ring of stages (cp.async, the same stage layout as trit_wgmma's, for NW
// consumer warps) and signal the stage's "full" mbarrier as their copies land (cp.async.mbarrier.arrive.noinc).
// Warpgroups 1.. are the consumers: they wait on "full", decode and issue the wgmmas as trit_wgmma does, and each
// warp arrives on the stage's "empty" mbarrier once the wgmmas that read it have retired (after the wait of the
// chunk after it, step AB - 1), which lets the producer refill it. No block-wide barrier in the main loop, and no
// global load or copy in the consumers'. With two consumer warpgroups, setmaxnreg moves registers from the producer to
// the consumers (56 and 224 a thread: 128 x (56 + 2 x 224) = 384 threads x 168, the cap at entry).

__device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(u32 bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
// arrives once this thread's earlier cp.async copies have landed (the count at init includes it: .noinc)
__device__ __forceinline__ void mbar_arrive_copies(u32 bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
    asm volatile(
        "{ .reg .pred p; WAIT: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1; @!p bra WAIT; }" ::"r"(bar),
        "r"(parity)
        : "memory");
}

template <int NTOK, int RT, int KI, int GS, int ST, int NW, int AB>
__global__ void __launch_bounds__(NW * 32 + 128, 1)
    trit_wgmma_ws(const U4* __restrict__ wq, const u32* __restrict__ sc, const u16* __restrict__ x,
                  u16* __restrict__ y, float* __restrict__ ws, int* __restrict__ locks, int M, int N, int K, int KS,
                  int GP, int chunks_per_split, int splits) {
    constexpr int KC = KI * 128;
    constexpr int NGC = GS == 0 ? 1 : (KC / GS);
    constexpr int WPG = GS == 0 ? 1 << 30 : GS / 32;
    static_assert(2 * NGC <= 32, "a warp's lanes copy a tile's scales for a chunk: two 16-byte pieces a group");
    static_assert(NW == 4 || NW == 8, "one or two consumer warpgroups");
    constexpr int X_BYTES = NTOK * KC * 2;
    constexpr int W_BYTES = NW * RT * KI * 512;
    constexpr int S_BYTES = GS == 0 ? 0 : NW * RT * NGC * 32;
    constexpr int STAGE = (X_BYTES + W_BYTES + S_BYTES + 1023) / 1024 * 1024;
    static_assert(ST >= 3, "a stage is released in the chunk after it was read");
    static_assert((AB == 2 || AB == 4) && (8 * KI) % AB == 0, "the buffers cycle over a chunk's k16 steps");
    constexpr int CPR = KC / 8, RPP = 128 / CPR, XP = NTOK / RPP;  // the producer's x copy: RPP tokens a pass
    static_assert(128 % CPR == 0 && NTOK % RPP == 0 && XP >= 1 && XP <= 32, "passes of the x copy cover NTOK");
    extern __shared__ __align__(128) unsigned char smem[];
    __shared__ __align__(8) unsigned long long bars[2 * ST];  // full[ST], then empty[ST]

    TOKEN_SLICE(NTOK)
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int NT = (N + 15) >> 4;
    const int nchunks = (KS + KI - 1) / KI;
    const int c0 = blockIdx.y * chunks_per_split;
    const int c1 = min(nchunks, c0 + chunks_per_split);
    const u32 base = (smem_addr(smem) + 1023) & ~1023u;
    const u32 full0 = smem_addr(bars), empty0 = full0 + ST * 8;
    if (threadIdx.x == 0)
#pragma unroll
        for (int st = 0; st < ST; ++st) {
            mbar_init(full0 + st * 8, 128);
            mbar_init(empty0 + st * 8, NW);
        }
    // the producer's x pieces: thread T copies piece kc = T % CPR of tokens T / CPR + p RPP; rows past M are
    // zeroed in every stage once, here (ordinary stores: fenced for the async proxy before the barrier)
    const int kc = threadIdx.x % CPR, n0 = threadIdx.x / CPR;
    u32 xlive = 0;
    if (warp < 4)
#pragma unroll
        for (int p = 0; p < XP; ++p) {
            const int row = n0 + p * RPP;
            const u32 off = x_piece<NTOK>(kc, row);
            if (row < M) xlive |= 1u << p;
            else
#pragma unroll
                for (int st = 0; st < ST; ++st)
                    asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};" ::"r"(base + st * STAGE + off), "r"(0u));
        }
    fence_proxy_async();
    __syncthreads();

    if (warp < 4) {  // producer
        if constexpr (NW == 8) asm volatile("setmaxnreg.dec.sync.aligned.u32 56;");
        const u16* xsrc = x + (long)n0 * K + kc * 8 + (long)c0 * KC;
        int xk = c0 * KC + kc * 8;
        for (int c = c0; c < c1; ++c) {
            const int s = c - c0, st = s % ST;
            if (s >= ST) mbar_wait(empty0 + st * 8, (s / ST - 1) & 1);
            const u32 sb = base + st * STAGE;
            const int xbytes = xk < K ? 16 : 0;
#pragma unroll
            for (int p = 0; p < XP; ++p)
                if (xlive & (1u << p)) {
                    const int row = n0 + p * RPP;
                    cp_async16(sb + x_piece<NTOK>(kc, row), xbytes ? xsrc + (long)p * RPP * K : x, xbytes);
                }
            xsrc += KC;
            xk += KC;
            const int step = c * KI;
            const bool full = step + KI <= KS;
#pragma unroll
            for (int j = 0; j < NW / 4; ++j) {  // consumer warp wc = warp + 4 j: its RT tiles' codes and scales
                const int wc = warp + 4 * j;
#pragma unroll
                for (int r = 0; r < RT; ++r) {
                    const int tile = (blockIdx.x * NW + wc) * RT + r;
                    if (tile >= NT) continue;
                    const U4* wsrc = wq + ((long)tile * KS + step) * 32 + lane;
#pragma unroll
                    for (int i = 0; i < KI; ++i)
                        if (full || step + i < KS)
                            cp_async16(sb + X_BYTES + (((wc * RT + r) * KI + i) * 32 + lane) * 16, wsrc + i * 32, 16);
                    if (GS != 0 && lane < 2 * NGC && (full || c * NGC + (lane >> 1) < GP))
                        cp_async16(sb + X_BYTES + W_BYTES + ((wc * RT + r) * NGC * 8 + lane * 4) * 4,
                                   sc + ((long)tile * GP + (long)c * NGC) * 8 + (lane & 1) * 4 + (lane >> 1) * 8, 16);
                }
            }
            mbar_arrive_copies(full0 + st * 8);
        }
        // no wait for the copies: each lands before its "full" phase completes, which the consumers wait for
    } else {  // consumers
        if constexpr (NW == 8) asm volatile("setmaxnreg.inc.sync.aligned.u32 224;");
        const int wc = warp - 4;
        const int g = lane >> 2, t = lane & 3;
        const int tile0 = (blockIdx.x * NW + wc) * RT;
        const u32 mask = 0x00030003u | (u32)(M >> 30);
        float acc[RT][NTOK / 2];
#pragma unroll
        for (int r = 0; r < RT; ++r)
#pragma unroll
            for (int e = 0; e < NTOK / 2; ++e) acc[r][e] = 0.f;
        u32 row_scale[RT];
#pragma unroll
        for (int r = 0; r < RT; ++r)
            row_scale[r] = (GS == 0 && tile0 + r < NT) ? ldg32(sc + (long)(tile0 + r) * GP * 8 + g) : 0u;
        u32 a[AB][RT][4];
        for (int c = c0; c < c1; ++c) {
            const int s = c - c0, st = s % ST;
            mbar_wait(full0 + st * 8, (s / ST) & 1);
            fence_proxy_async();
            const u32 sb = base + st * STAGE, dlo = smem_desc_lo(sb);
            // after the wait at step AB - 1 every wgmma of the chunk before has retired: its stage goes back to
            // the producer
            WGMMA_CHUNK(wc, if (step == AB - 1 && s > 0 && lane == 0) mbar_arrive(empty0 + ((s - 1) % ST) * 8);)
        }
        wgmma_wait<0>();
        WGMMA_STORE
    }
    // split-K's finish once, after the roles' branches: its block barriers see every warp at the same place
    if (splits > 1) splitk_finish(y, ws, locks, M, N, NW * RT * 16, splits);
}
