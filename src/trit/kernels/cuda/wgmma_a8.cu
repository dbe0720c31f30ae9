// trit_wgmma_a8: y[M, N] = W1.58A8 of x for a ternary W in the mma layout, on Hopper's int8 warpgroup MMA
// (wgmma.mma_async ... s32.u8.s8 or s32.s8.s8, sm_90a). Compiled after wgmma.cu (its fences, descriptors, swizzle
// and stage ring) and the u8 x s8 and s8 x s8 wrappers that trit/kernels/cuda/wgmma_a8.py writes for each token
// width.
//
// x arrives rounded (trit.kernels.triton.quantize.quantize_rows_mma): int8 codes (M, KP), KP the layout's padded
// K, each 32 inputs in the order of the A fragment's k32 (wgmma_a8.input_order), the padding zero; each token's
// scale s = 127 / max|x| and the sum of its codes. A word of the layout is then the A operand of one k32 step as
// it stands: register q is the bytes (w >> 2q) & 0x03030303, the codes c = w + 1 in {0, 1, 2} as u8. The MMAs
// sum c x_q exactly in int32, and y = (sum c x_q - sum x_q) * scale / s, one float step an output.
//
// Groups of GS = 64 or 128 inputs a scale: the codes go in as s8 (c - 1, a shift, two LOP3s and an IMAD a
// register), so no sum of x_q is needed; the first wgmma of a group starts its int32 sums afresh, and after the
// group's last one the warpgroup waits for them and adds sum * scale (the group's, from the stage) to float sums;
// y = those / s.
//
// The pipeline is trit_wgmma's: a ring of ST stages of activations (in the 128-byte swizzle, an atom of 128
// inputs a token) and codes, refilled two chunks after a stage was read; a warp's four warps each own RT 16-row
// tiles; AB A-register buffers let AB - 1 groups of wgmmas run behind the decode. Split-K adds float partial
// sums into the workspace (the split that starts at K = 0 subtracts the code sum).

template <int NTOK, int RT, int KI, int GS, int ST, int NW, int AB>
__global__ void __launch_bounds__(NW * 32) trit_wgmma_a8(const U4* __restrict__ wq, const u32* __restrict__ sc,
                                                     const signed char* __restrict__ x, u16* __restrict__ y,
                                                     float* __restrict__ ws, int* __restrict__ locks,
                                                     const float* __restrict__ xs, const int* __restrict__ xsum,
                                                     int M, int N, int K, int KS, int GP, int chunks_per_split,
                                                     int splits) {
    static_assert(GS == 0 || GS == 64 || GS == 128, "one scale a row, or groups of 64 or 128");
    static_assert(GS == 0 || RT * NTOK <= 128, "groups: float sums beside the int32 ones, within the registers");
    constexpr int KC = KI * 128;                      // inputs, and bytes of a token's x, a chunk
    constexpr int NGC = GS == 0 ? 1 : KC / GS;        // scale groups a chunk (CODE_SOURCES and STAGE_CODES read it)
    constexpr int KPG = GS == 0 ? 1 << 30 : GS / 32;  // k32 steps a scale group
    // groups of wgmmas left in flight behind the decode: within a scale group, at most its steps before this one
    constexpr int IN_FLIGHT = GS == 0 || AB - 1 < KPG - 1 ? AB - 1 : KPG - 1;
    constexpr int NTH = NW * 32;
    static_assert(NW % 4 == 0, "whole warpgroups");
    constexpr int X_BYTES = NTOK * KC;
    constexpr int W_BYTES = NW * RT * KI * 512;
    constexpr int S_BYTES = GS == 0 ? 0 : NW * RT * NGC * 32;  // a tile's scale words, 8 a group
    constexpr int STAGE = (X_BYTES + W_BYTES + S_BYTES + 1023) / 1024 * 1024;  // atoms on 1024-byte boundaries
    static_assert(ST >= 3, "a stage is refilled two chunks after it was read");
    static_assert((AB == 2 || AB == 4) && (4 * KI) % AB == 0, "the buffers cycle over a chunk's k32 steps");
    extern __shared__ __align__(128) unsigned char smem[];  // [ST][x | codes], from a 1024-byte boundary

    TOKEN_SLICE(NTOK)
    xs += blockIdx.z * NTOK;
    xsum += blockIdx.z * NTOK;
    BLOCK_COORDS
    const u32 mask = 0x03030303u | (u32)(M >> 30);
    const u32 base = (smem_addr(smem) + 1023) & ~1023u;

    int acc[RT][NTOK / 2];
    float facc[GS == 0 ? 1 : RT][GS == 0 ? 1 : NTOK / 2];  // groups: the scaled sums of the groups so far
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
        for (int e = 0; e < NTOK / 2; ++e) {
            acc[r][e] = 0;
            if (GS != 0) facc[r][e] = 0.f;
        }
    // an empty asm on every int32 sum: the compiler may not move their reads across a wgmma fence or wait
    auto pin_sums = [&]() {
#pragma unroll
        for (int r = 0; r < RT; ++r)
#pragma unroll
            for (int e = 0; e < NTOK / 2; ++e) asm volatile("" : "+r"(acc[r][e]));
    };

    WGMMA_X_COPY(signed char, 16)
    CODE_SOURCES
    int step = c0 * KI;
    const u32 w_off = X_BYTES + ((warp * RT) * KI * 32 + lane) * 16;
    const u32 s_off = X_BYTES + W_BYTES + ((warp * RT) * NGC * 8 + lane * 4) * 4;  // groups: the scales' copy
    (void)ssrc;
    (void)s_off;

    auto load_stage = [&](int st) {
        const u32 sb = base + st * STAGE;
        const int xbytes = xk < K ? 16 : 0;  // past K (a chunk's tail): zeros, from a valid address
        const signed char* src = xbytes ? xsrc : x;
        const long pass = xbytes ? (long)RPP * K : 0;
#pragma unroll
        for (int p = 0; p < XP; ++p)
            if (xlive & (1u << p)) cp_async16(sb + x_off + p * RPP * 128, src + p * pass, xbytes);
        STAGE_CODES(sb)
        xsrc += KC;
        xk += KC;
        step += KI;
    };

    WGMMA_RING_FILL
    u32 a[AB][RT][4];
    for (int c = c0; c < c1; ++c) {
        WGMMA_RING_NEXT
#pragma unroll
        for (int i = 0; i < KI; ++i) {
            if (c * KI + i >= KS) break;
            U4 wv[RT];
#pragma unroll
            for (int r = 0; r < RT; ++r) wv[r] = lds128(sb + X_BYTES + (((warp * RT + r) * KI + i) * 32 + lane) * 16);
#pragma unroll
            for (int j = 0; j < 4; ++j) {  // word j: the k32 step of inputs 32 j to 32 j + 31 of the 128
                const int q = (i * 4 + j) % AB;
#pragma unroll
                for (int r = 0; r < RT; ++r) {
                    const u32 w = j == 0 ? wv[r].x : j == 1 ? wv[r].y : j == 2 ? wv[r].z : wv[r].w;
#pragma unroll
                    for (int b = 0; b < 4; ++b) {
                        const u32 v = w >> (2 * b);
                        if (GS == 0) {
                            a[q][r][b] = v & mask;
                        } else {  // c - 1 a byte: bit 0 is ~lo; bits 1-7 are set where c = 0 (lo = hi = 0)
                            const u32 zero = ~v & ~(v >> 1) & 0x01010101u;
                            a[q][r][b] = (zero * 0xFEu) | (~v & 0x01010101u);
                        }
                    }
                }
                const unsigned long long d = smem_desc_sw128(dlo + ((i * NTOK * 128 + j * 32) >> 4));
                const int kk = i * 4 + j;  // the k32 step within the chunk
                if (GS != 0) pin_sums();  // the last group's reads of the sums stay before the fence
                wgmma_fence();
#pragma unroll
                for (int r = 0; r < RT; ++r) {
                    if (GS == 0) wgmma_u8s8<NTOK>(acc[r], a[q][r], d);
                    else wgmma_s8s8<NTOK>(acc[r], a[q][r], d, kk % KPG != 0);
                }
                wgmma_commit();
                if (GS != 0 && kk % KPG == KPG - 1) {  // the group's last step: its sums, scaled, into facc
                    wgmma_wait<0>();
                    pin_sums();  // the sums are read after the wait, not moved above it
                    const int grp = kk / KPG;
                    if (c * NGC + grp < GP)
#pragma unroll
                        for (int r = 0; r < RT; ++r) {
                            const u32 sw = lds32(sb + X_BYTES + W_BYTES + (((warp * RT + r) * NGC + grp) * 8 + g) * 4);
                            const float s_lo = bf16_to_f32((u16)(sw & 0xFFFFu)), s_hi = bf16_to_f32((u16)(sw >> 16));
#pragma unroll
                            for (int e = 0; e < NTOK / 2; ++e)
                                facc[r][e] = fmaf((float)acc[r][e], e % 4 >= 2 ? s_hi : s_lo, facc[r][e]);
                        }
                } else {
                    wgmma_wait<IN_FLIGHT>();
                }
            }
        }
    }
    wgmma_wait<0>();
    cp_async_wait<0>();

    // accumulator e of a thread is token tile e / 4, as an m16n8 C fragment: row g (+ 8 for e % 4 >= 2), tokens
    // 2t and 2t + 1; the row's scale is the low (row g) or high (row g + 8) half of its lane's scale word. A token's
    // sum and scale are read once for its four accumulators a tile, the division a fast reciprocal (within 2 ulp:
    // bf16 output). A block whose tiles and tokens are all in bounds, without split-K, stores without checks.
    float s_row[RT][2];
#pragma unroll
    for (int r = 0; r < RT; ++r) {
        const u32 sw = (GS == 0 && tile0 + r < NT) ? ldg32(sc + (long)(tile0 + r) * GP * 8 + g) : 0u;
        s_row[r][0] = bf16_to_f32((u16)(sw & 0xFFFFu));
        s_row[r][1] = bf16_to_f32((u16)(sw >> 16));
    }
    const bool whole = splits == 1 && M == NTOK && (tile0 + RT) * 16 <= N;
#pragma unroll
    for (int tt = 0; tt < NTOK / 8; ++tt)
#pragma unroll
        for (int lo = 0; lo < 2; ++lo) {
            const int m = tt * 8 + 2 * t + lo;
            if (!whole && m >= M) continue;
            const int corr = GS == 0 && blockIdx.y == 0 ? xsum[m] : 0;
            const float inv = __fdividef(1.f, xs[m]);
            u16* yrow = y + (long)m * N + tile0 * 16 + g;
#pragma unroll
            for (int hi = 0; hi < 2; ++hi)
#pragma unroll
                for (int r = 0; r < RT; ++r) {
                    const int e = tt * 4 + hi * 2 + lo;
                    const float v = GS == 0 ? (float)(acc[r][e] - corr) * (s_row[r][hi] * inv)
                                            : facc[GS == 0 ? 0 : r][GS == 0 ? 0 : e] * inv;
                    if (whole) {
                        yrow[r * 16 + hi * 8] = f32_to_bf16(v);
                        continue;
                    }
                    const int n = (tile0 + r) * 16 + g + hi * 8;
                    if (n >= N) continue;
                    if (splits == 1) y[(long)m * N + n] = f32_to_bf16(v);
                    else red_add(ws + (long)m * N + n, v);
                }
        }
    if (splits > 1) splitk_finish(y, ws, locks, M, N, NW * RT * 16, splits);
}
