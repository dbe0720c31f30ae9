// trit_imma: y[M, N] = x[M, K] @ W.T for a few tokens (M <= 8 NTT) on int8 tensor cores (mma.sync m16n8k32),
// from the same load-time "mma" layout as trit_gemv and trit_mma (trit/kernels/cuda/mma.py documents it), and
// with trit_gemv's arithmetic: the activations rounded per 128-input step to 15-bit integers xi (x ~= xi * inv,
// inv a power of two), integer sums of codes c = w + 1 times xi a scale group, sum (c - 1) x = sum c x - sum x.
//
// A word of the layout holds 16 codes of a lane's A fragment; (word >> 2k) & 0x03030303 is four of them, all of
// row g (k = 0, 2) or g + 8 (k = 1, 3), as the four bytes of an m16n8k32 A register: a_k, with no other
// decoding. The MMA's reduction index is a permutation of the word's 32 inputs: byte b of a_k holds the input
// 2t + 8 (k >> 1) + (b >> 1) + 16 (b & 1), so the B fragment of a lane (token g, quad t) holds the same inputs:
// b0 for k >> 1 = 0, b1 for 1. xi = 256 hi + lo with hi in [-128, 128) and lo in [0, 256), so the codes
// (u8) meet the high bytes (s8) and the low bytes (u8) in two MMAs, and 256 * hi_sum + lo_sum is the exact
// integer sum. A block rounds its share of the activations into shared memory once, each record ordered so
// that one 16-byte load gives a lane its hi b0, hi b1, lo b0, lo b1.
//
// Eight tokens fill an MMA's B operand, so every M up to 8 NTT costs the same decoding and loads (the rounding grows with M): a 32-bit
// word, four logic ops and three shifts for 16 weights, and 2 NTT MMAs. Codes and scales go through a ring of
// ST shared-memory stages filled by cp.async, each lane its own 16 bytes (so no barrier); the first ST - 1
// stages are in flight before the activations are rounded. Split-K adds into the fp32 workspace with red.add,
// and the last block of a row block writes the output (splitk_finish, as trit_gemv and trit_mma). No headers:
// compiled by NVRTC after common.cuh.

__device__ __forceinline__ void imma_u8s8(int (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm(
        "mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void imma_u8u8(int (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm(
        "mma.sync.aligned.m16n8k32.row.col.s32.u8.u8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void cp_async4(u32 dst, const void* src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst), "l"(src));
}

// NTT: tiles of 8 tokens (M <= 8 NTT); RT: 16-row tiles a warp; GS: inputs a scale (32, 64, 128; 0 = one scale
// a row); NW: warps a block (they share the rounded activations); ST: stages of codes in the cp.async ring.
template <int NTT, int RT, int GS, int NW, int ST>
__global__ void __launch_bounds__(NW * 32) trit_imma(const U4* __restrict__ wq, const u32* __restrict__ sc,
                                                 const u16* __restrict__ x, u16* __restrict__ y,
                                                 float* __restrict__ ws, int* __restrict__ locks, int M, int N,
                                                 int K, int KS, int GP, int steps_per_split, int splits) {
    constexpr int MG = 8 * NTT;
    constexpr int U = GS == 0 ? 4 : GS / 32;  // words a unit: a scale group, or a step when groups are larger
    constexpr int UPS = 4 / U;                 // units a step
    constexpr int NSC = GS == 0 ? 0 : UPS;     // scale words a step and row tile
    // shared memory: a record a step, [4 words][MG tokens][4 t] x 16 B (hi b0, hi b1, lo b0, lo b1) | inv [MG] |
    // the unit sums [UPS][MG] (sum xi * inv), f32, padded to 16 bytes; after steps_per_split records, the ring:
    // codes [ST][RT][NW * 32] x 16 B, then scales [ST][RT][NSC][NW * 32] x 4 B
    constexpr int XI_OFF = 256 * MG, XU_OFF = XI_OFF + 4 * MG;
    constexpr int SB = (XU_OFF + 4 * UPS * MG + 15) / 16 * 16;
    constexpr int WSLOT = NW * 32 * 16, SSLOT = NW * 32 * 4;
    extern __shared__ __align__(16) unsigned char smem[];

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int NT = (N + 15) >> 4;
    const int s0 = blockIdx.y * steps_per_split;
    const int s1 = min(KS, s0 + steps_per_split);
    const int nsteps = s1 - s0;
    const u32 base = (u32)__cvta_generic_to_shared(smem);
    const u32 ring_w = base + steps_per_split * SB + threadIdx.x * 16;
    const u32 ring_s = base + steps_per_split * SB + ST * RT * WSLOT + threadIdx.x * 4;

    // 1. The first ST - 1 steps of codes and scales in flight (a group a step, empty past the split's end).
    const int tile0 = (blockIdx.x * NW + warp) * RT;
    const U4* wp[RT];
    const u32* sp[RT];
    u32 row_scale[RT];
#pragma unroll
    for (int r = 0; r < RT; ++r) {
        const int tile = min(tile0 + r, NT - 1);  // a tile past N reads the last one, and is never stored
        wp[r] = wq + ((long)tile * KS + s0) * 32 + lane;
        sp[r] = sc + ((long)tile * GP + (GS == 0 ? 0 : s0 * UPS)) * 8 + g;
        row_scale[r] = GS == 0 ? ldg32(sp[r]) : 0u;
    }
    // step ``step``'s codes and scales of every row tile into ring slot ``slot``, then a group ends (empty past
    // the split's end: the waits count one group a step)
    auto fill_slot = [&](int step, int slot) {
        if (step < nsteps) {
#pragma unroll
            for (int r = 0; r < RT; ++r) {
                cp_async16(ring_w + (slot * RT + r) * WSLOT, wp[r] + step * 32, 16);
#pragma unroll
                for (int u = 0; u < NSC; ++u)
                    cp_async4(ring_s + ((slot * RT + r) * NSC + u) * SSLOT, sp[r] + (step * UPS + u) * 8);
            }
        }
        cp_async_commit();
    };
#pragma unroll
    for (int p = 0; p < ST - 1; ++p) fill_slot(p, p);

    // 2. Round this block's share of the activations: a warp a (step, token), four inputs a lane, the jobs of the
    // M tokens spread over the warps, QB jobs' loads at once. Tokens past M are left unwritten: an MMA's token
    // columns are independent, and theirs are never stored.
    const int mm = min(M, MG), jobs = nsteps * mm;
    for (int first = warp; first < jobs; first += QB * NW) {
        uint2 raw[QB];
#pragma unroll
        for (int q = 0; q < QB; ++q) {
            const int job = first + q * NW;
            raw[q] = job < jobs ? load_x4(x, job % mm, M, K, (s0 + job / mm) * 128 + 4 * lane) : make_uint2(0u, 0u);
        }
#pragma unroll
        for (int q = 0; q < QB; ++q) {
            const int job = first + q * NW;
            if (job >= jobs) break;
            const int i = job / mm, m = job % mm;
            unsigned char* rec = smem + i * SB;
            float v[4], up, inv;
            step_scale(raw[q], v, up, inv);
            int part = 0;
#pragma unroll
            for (int vv = 0; vv < 4; ++vv) {
                const int xi = __float2int_rn(v[vv] * up);
                part += xi;
                const int c = 4 * lane + vv, j = c >> 5, c32 = c & 31, rem = c32 & 15;
                const int b = (c32 >> 4) | ((rem & 1) << 1), tq = (rem >> 1) & 3, h = rem >> 3;
                unsigned char* p = rec + ((j * MG + m) * 4 + tq) * 16 + h * 4 + b;
                p[0] = (unsigned char)(xi >> 8);    // hi: an s8
                p[8] = (unsigned char)(xi & 0xFF);  // lo: a u8
            }
#pragma unroll
            for (int o = 1; o < 8 * U; o <<= 1) part += __shfl_xor_sync(0xFFFFFFFFu, part, o);
            if (lane % (8 * U) == 0) reinterpret_cast<float*>(rec + XU_OFF)[(lane / (8 * U)) * MG + m] = (float)part * inv;
            if (lane == 0) reinterpret_cast<float*>(rec + XI_OFF)[m] = inv;
        }
    }
    __syncthreads();

    // 3. A step at a time: fill the stage the step before consumed, wait for this step's, then a word at a time
    // four A registers, two MMAs a token tile, and at a unit's end the integer sums to floats.
    float acc[RT][NTT][4];
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
        for (int nt = 0; nt < NTT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[r][nt][e] = 0.f;

    int slot = 0;
    for (int i = 0; i < nsteps; ++i) {
        fill_slot(i + ST - 1, slot == 0 ? ST - 1 : slot - 1);  // the slot the step before consumed
        cp_async_wait<ST - 1>();  // this step's group is done (each lane reads only what it copied)
        const u32 rec = base + i * SB;
        U4 wv[RT];
#pragma unroll
        for (int r = 0; r < RT; ++r) wv[r] = lds128(ring_w + (slot * RT + r) * WSLOT);
        int ihi[RT][NTT][4], ilo[RT][NTT][4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            U4 B[NTT];
#pragma unroll
            for (int nt = 0; nt < NTT; ++nt) B[nt] = lds128(rec + ((j * MG + nt * 8 + g) * 4 + t) * 16);
#pragma unroll
            for (int r = 0; r < RT; ++r) {
                const u32 w = j == 0 ? wv[r].x : j == 1 ? wv[r].y : j == 2 ? wv[r].z : wv[r].w;
                const u32 a[4] = {w & 0x03030303u, (w >> 2) & 0x03030303u, (w >> 4) & 0x03030303u,
                                  (w >> 6) & 0x03030303u};
#pragma unroll
                for (int nt = 0; nt < NTT; ++nt) {
                    if (j % U == 0) {
#pragma unroll
                        for (int e = 0; e < 4; ++e) ihi[r][nt][e] = ilo[r][nt][e] = 0;
                    }
                    imma_u8s8(ihi[r][nt], a, B[nt].x, B[nt].y);
                    imma_u8u8(ilo[r][nt], a, B[nt].z, B[nt].w);
                }
            }
            if ((j + 1) % U == 0) {  // a unit ends: to floats, less sum x, times the group scale
                const int u = j / U;
#pragma unroll
                for (int nt = 0; nt < NTT; ++nt) {
                    const int m0 = nt * 8 + 2 * t;
                    const float inv0 = lds32f(rec + XI_OFF + m0 * 4), inv1 = lds32f(rec + XI_OFF + m0 * 4 + 4);
                    const float xo0 = lds32f(rec + XU_OFF + (u * MG + m0) * 4);
                    const float xo1 = lds32f(rec + XU_OFF + (u * MG + m0) * 4 + 4);
#pragma unroll
                    for (int r = 0; r < RT; ++r) {
                        const u32 sw = GS == 0 ? 0u : lds32(ring_s + ((slot * RT + r) * NSC + u) * SSLOT);
#pragma unroll
                        for (int e = 0; e < 4; ++e) {
                            const int s = ihi[r][nt][e] * 256 + ilo[r][nt][e];  // |s| < 2^23: exact in f32
                            const float d = fmaf((float)s, e & 1 ? inv1 : inv0, -(e & 1 ? xo1 : xo0));
                            if (GS == 0) acc[r][nt][e] += d;
                            else acc[r][nt][e] = fmaf(__uint_as_float(e < 2 ? sw << 16 : sw & 0xFFFF0000u), d,
                                                      acc[r][nt][e]);
                        }
                    }
                }
            }
        }
        slot = slot == ST - 1 ? 0 : slot + 1;
    }
    cp_async_wait<0>();

    // 4. Lane (g, t) holds rows g (e = 0, 1) and g + 8 (e = 2, 3), tokens 2t + (e & 1) of each token tile.
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
        for (int nt = 0; nt < NTT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                float v = acc[r][nt][e];
                if (GS == 0) v *= bf16_to_f32((u16)(e < 2 ? row_scale[r] & 0xFFFF : row_scale[r] >> 16));
                const int n = (tile0 + r) * 16 + g + (e < 2 ? 0 : 8), m = nt * 8 + 2 * t + (e & 1);
                if (m < M && n < N && tile0 + r < NT) {
                    if (splits == 1) y[(long)m * N + n] = f32_to_bf16(v);
                    else red_add(ws + (long)m * N + n, v);
                }
            }
    if (splits > 1) splitk_finish(y, ws, locks, M, N, NW * RT * 16, splits);
}
