// trit_mma: y[M, N] = x[M, K] @ W.T for a ternary W in the load-time "mma" layout
// (trit/kernels/cuda/mma.py makes it and documents it), on mma.sync tensor cores.
//
// The product is turned around (y.T = W @ x.T) so that 16 weight rows fill the
// MMA's A operand (m16n8k16, bf16 in, fp32 accumulate) and up to 64 tokens its
// B operand. One 128-bit load gives a lane the codes of all its A fragments for
// 128 inputs of a 16-row tile; a 32-bit word decodes into the eight A registers
// of two k16 steps with a lop3, a bf16x2 FMA (code -> -1, 0, +1) and a bf16x2
// multiply by the group scale for each register, and three shifts a word (decode,
// below). A chunk's activations,
// codes and scales go through a ring of shared-memory stages, filled by cp.async
// several chunks ahead; the activations are read with ldmatrix.
//
// Split-K adds partial sums into an fp32 workspace with red.add; the last block
// of a row block (a counter per row block) writes the bf16 output and zeroes its
// workspace rows and counter, so the workspace is zero again for the next call.
// No headers: compiled by NVRTC after common.cuh.

__device__ __forceinline__ u32 smem_addr(const void* p) {
    return (u32)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void ldmatrix_x4(u32 addr, u32& d0, u32& d1, u32& d2, u32& d3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(d0), "=r"(d1), "=r"(d2), "=r"(d3)
                 : "r"(addr));
}

__device__ __forceinline__ void ldmatrix_x2(u32 addr, u32& d0, u32& d1) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];" : "=r"(d0), "=r"(d1) : "r"(addr));
}

__device__ __forceinline__ void mma_bf16(float (&c)[4], const u32* a, u32 b0, u32 b1) {
    asm(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The same with C = 0: the first MMA of a chain overwrites its accumulator.
__device__ __forceinline__ void mma_bf16_first(float (&c)[4], const u32* a, u32 b0, u32 b1) {
    asm(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%10, %10, %10, %10};"
        : "=f"(c[0]), "=f"(c[1]), "=f"(c[2]), "=f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.f));
}

// (v & m) | b in one lop3 (the compiler would split a mask it can see through into two)
__device__ __forceinline__ u32 and_or(u32 v, u32 m, u32 b) {
    u32 d;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(v), "r"(m), "r"(b));
    return d;
}

__device__ __forceinline__ u32 ternary(u32 w, int q, u32 s, u32 mask) {
    return fma_bf16x2(fma_bf16x2(((w >> (2 * q)) & mask) | BASE, ONE, M129), s, NEG_ZERO);
}

// One word holds the codes of the eight A registers of two k16 steps, register q in
// bits 2q (element 0) and 16 + 2q (element 1). Registers 0 and 2 (4 and 6) hold
// row g, 1 and 3 (5 and 7) row g + 8: s0 and s1 are their scales, both halves
// (splat_lo / splat_hi of the pair: written as 16-bit movs, ptxas folds them into
// the multiply's operand, .H0_H0 / .H1_H1, where a byte permute cost a prmt each).
// ``mask`` is 0x00030003, held in a register (the compiler would otherwise
// rematerialize the constant before every lop3).
// Half s of it: the four registers of k16 step s.
__device__ __forceinline__ void decode(u32 w, int s, u32 s0, u32 s1, u32 mask, u32 (&a)[4]) {
    // registers 4s to 4s + 2 masked in place (bits 0-5 of each half of w >> 8s: the codes times 1, 4 and 16
    // added to 128, within the bf16 mantissa), each FMA scaled back: 128 + 4^i c -> c - 1, exact; register
    // 4s + 3 (bits 6-7 of the half, past the mantissa) shifted down
    const u32 v = s ? w >> 8 : w;
    a[0] = fma_bf16x2(fma_bf16x2(and_or(v, mask, BASE), ONE, M129), s0, NEG_ZERO);
    a[1] = fma_bf16x2(fma_bf16x2(and_or(v, mask << 2, BASE), 0x3E803E80u, 0xC204C204u), s1, NEG_ZERO);
    a[2] = fma_bf16x2(fma_bf16x2(and_or(v, mask << 4, BASE), 0x3D803D80u, 0xC110C110u), s0, NEG_ZERO);
    a[3] = fma_bf16x2(fma_bf16x2(and_or(v >> 6, mask, BASE), ONE, M129), s1, NEG_ZERO);
}

// Without the -129 and the scale: register q is the bf16 pair 128 + c, two ops.
__device__ __forceinline__ void decode_raw(u32 w, int s, u32 mask, u32 (&a)[4]) {
#pragma unroll
    for (int q = 0; q < 4; ++q) a[q] = ((w >> (2 * (4 * s + q))) & mask) | BASE;
}

__device__ __forceinline__ u32 splat_lo(u32 v) {
    u32 d;
    asm("{ .reg .b16 l, h; mov.b32 {l, h}, %1; mov.b32 %0, {l, l}; }" : "=r"(d) : "r"(v));
    return d;
}
__device__ __forceinline__ u32 splat_hi(u32 v) {
    u32 d;
    asm("{ .reg .b16 l, h; mov.b32 {l, h}, %1; mov.b32 %0, {h, h}; }" : "=r"(d) : "r"(v));
    return d;
}

// A block's coordinates (trit_mma, trit_wgmma, trit_wgmma_a8): lane and warp, the lane's row group g and pair t
// in an MMA fragment, the layout's 16-row tiles NT and this warp's first tile0, and the chunks [c0, c1) of K its
// split takes.
#define BLOCK_COORDS                                                                                        \
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;                                             \
    const int g = lane >> 2, t = lane & 3;                                                                  \
    const int NT = (N + 15) >> 4;                                                                           \
    const int tile0 = (blockIdx.x * NW + warp) * RT;                                                        \
    const int nchunks = (KS + KI - 1) / KI;                                                                 \
    const int c0 = blockIdx.y * chunks_per_split;                                                           \
    const int c1 = min(nchunks, c0 + chunks_per_split);

// This block's slice of tokens (the grid's third dimension): rows ROWS z to ROWS (z + 1) of x, y and the
// workspace, its row blocks' counters, and M cut to the rows it holds (trit_mma, trit_wgmma, trit_wgmma_ws).
#define TOKEN_SLICE(ROWS)                                                                                   \
    {                                                                                                       \
        const int m0 = blockIdx.z * (ROWS);                                                                 \
        x += (long)m0 * K;                                                                                  \
        y += (long)m0 * N;                                                                                  \
        ws += (long)m0 * N;                                                                                 \
        locks += blockIdx.z * gridDim.x;                                                                    \
        M = min(M - m0, (ROWS));                                                                            \
    }

// The codes and scales of a warp's RT 16-row tiles go through the ring of shared-memory stages the same way in
// trit_mma and trit_wgmma: KI 16-byte words a tile and lane, and the tile's NGC group scales (two 16-byte pieces
// a group, from lanes 0 to 2 NGC - 1). CODE_SOURCES declares wsrc, ssrc (each live tile's sources at chunk c0)
// and tlive (bit r: tile r exists); STAGE_CODES(sb) copies the chunk starting at 128-input step ``step`` into
// stage sb (w_off, s_off: this lane's slots) and moves the sources on a chunk. Tiles past the last one and steps
// past KS (the tail) are not copied. Macros, not functions: a device function here compiles to other SASS for
// several shipped configs (more or fewer instructions in the main loop), which nothing has measured.
#define CODE_SOURCES                                                                                        \
    const U4* wsrc[RT];                                                                                     \
    const u32* ssrc[RT];                                                                                    \
    u32 tlive = 0;                                                                                          \
    _Pragma("unroll") for (int r = 0; r < RT; ++r) {                                                        \
        const int tile = min(tile0 + r, NT - 1);                                                            \
        if (tile0 + r < NT) tlive |= 1u << r;                                                               \
        wsrc[r] = wq + ((long)tile * KS + (long)c0 * KI) * 32 + lane;                                       \
        ssrc[r] = sc + ((long)tile * GP + (long)c0 * NGC) * 8 + (lane & 1) * 4 + (lane >> 1) * 8;           \
    }

#define STAGE_CODES(sb)                                                                                     \
    {                                                                                                       \
        const bool full = step + KI <= KS;                                                                  \
        _Pragma("unroll") for (int r = 0; r < RT; ++r) {                                                    \
            if (!(tlive & (1u << r))) continue;                                                             \
            _Pragma("unroll") for (int i = 0; i < KI; ++i) if (full || step + i < KS)                       \
                cp_async16((sb) + w_off + (r * KI + i) * 32 * 16, wsrc[r] + i * 32, 16);                    \
            if (GS != 0 && lane < 2 * NGC && (full || (step / KI) * NGC + (lane >> 1) < GP))                \
                cp_async16((sb) + s_off + r * NGC * 8 * 4, ssrc[r], 16);                                    \
            wsrc[r] += KI * 32;                                                                             \
            ssrc[r] += NGC * 8;                                                                             \
        }                                                                                                   \
    }

// MT: token tiles of 8 a block (8 * MT tokens, MT <= 8; blockIdx.z picks the slice of tokens, so M
// is not bounded); RT: 16-row tiles a warp; KI: 128-input steps a
// chunk; GS: inputs a scale (32, 64, 128; 0 = one scale a row); ST: pipeline stages;
// NW: warps a block (they share the staged activations);
// FOLD: multiply the raw codes (128 + c) and fold the offset and the scale in per
// group, in fp32: sum (c - 1) s x = s (sum (128 + c) x - 129 sum x), with sum x
// from an MMA of all-ones rows (two ops a register instead of four; the fix-up
// costs about 12 MT ops a group and tile, so it pays for few tokens). The first
// MMA of each group starts its sums from zero.
template <int MT, int RT, int KI, int GS, int ST, bool FOLD, int NW>
__global__ void __launch_bounds__(NW * 32) trit_mma(const U4* __restrict__ wq, const u32* __restrict__ sc,
                                                const u16* __restrict__ x, u16* __restrict__ y,
                                                float* __restrict__ ws, int* __restrict__ locks, int M, int N,
                                                int K, int KS, int GP, int chunks_per_split, int splits) {
    constexpr int KC = KI * 128;                      // inputs a chunk
    constexpr int LDS = KC + 8;                       // smem row stride (bf16): 16 bytes of padding, no bank conflicts
    constexpr int ROWS = MT * 8;                      // token rows staged
    constexpr int NGC = GS == 0 ? 1 : (KC / GS);      // scale groups a chunk
    constexpr int WPG = GS == 0 ? 1 << 30 : GS / 32;  // words a scale group (GS >= 32)
    constexpr int X_BYTES = ROWS * LDS * 2;
    constexpr int W_BYTES = NW * RT * KI * 512;
    constexpr int S_BYTES = GS == 0 ? 0 : NW * RT * NGC * 32;
    constexpr int STAGE = X_BYTES + W_BYTES + S_BYTES;
    extern __shared__ __align__(16) unsigned char smem[];  // [ST][x | codes | scales]

    TOKEN_SLICE(ROWS)
    BLOCK_COORDS
    const u32 mask = 0x00030003u | (u32)(M >> 30);  // M < 2^30: the constant, opaque to the compiler
    const u32 base = smem_addr(smem);

    float acc[RT][MT][4];
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
        for (int j = 0; j < MT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[r][j][e] = 0.f;

    constexpr int FIX = GS == 0 ? 4 : GS / 32;  // FOLD: words between fix-ups (a group, or a 128-step)
    // FOLD: this group's sums of (128 + c) x and of x, one set for each of a word's two
    // k16 steps (two independent MMA chains)
    float tmp[2][RT][MT][4], xsum[2][MT][4];
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int tt = 0; tt < MT; ++tt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                xsum[h][tt][e] = 0.f;
#pragma unroll
                for (int r = 0; r < RT; ++r) tmp[h][r][tt][e] = 0.f;
            }
    const u32 ones[4] = {ONE, ONE, ONE, ONE};
    auto scale_word = [&](u32 sb, int r, int grp_in_chunk, u32 whole_row) -> u32 {
        return GS == 0 ? whole_row : lds32(sb + X_BYTES + W_BYTES + ((warp * RT + r) * NGC * 8 + grp_in_chunk * 8 + g) * 4);
    };

    u32 row_scale[RT];  // GS == 0: one scale word a row tile, for the whole call
#pragma unroll
    for (int r = 0; r < RT; ++r)
        row_scale[r] = (GS == 0 && tile0 + r < NT) ? ldg32(sc + (long)(tile0 + r) * GP * 8 + g) : 0u;

    // Staging, with every address that does not change between chunks worked out once.
    // Activations: KC / 8 16-byte vectors a row, 32 NW / (KC / 8) rows a pass of the block;
    // a thread always copies the same column of its rows. Rows past M are zeroed once.
    constexpr int VPR = KC / 8, RSTEP = NW * 32 / VPR, XPT = (ROWS + RSTEP - 1) / RSTEP;
    const int xrow0 = threadIdx.x / VPR, xkv = (threadIdx.x % VPR) * 8;
    const u32 xs_off = (xrow0 * LDS + xkv) * 2;
#pragma unroll
    for (int v = 0; v < XPT; ++v) {
        const int row = xrow0 + v * RSTEP;
        if (row < ROWS && row >= M)
#pragma unroll
            for (int st = 0; st < ST; ++st)
                asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};" ::"r"(base + st * STAGE + xs_off +
                                                                             v * RSTEP * LDS * 2),
                             "r"(0u));
    }
    // Sources advance by one chunk a load (chunks are loaded in order).
    u32 xlive = 0;
#pragma unroll
    for (int v = 0; v < XPT; ++v)
        if (xrow0 + v * RSTEP < M && xrow0 + v * RSTEP < ROWS) xlive |= 1u << v;
    const u16* xsrc = x + (long)xrow0 * K + xkv + (long)c0 * KC;
    int xk = c0 * KC + xkv;
    CODE_SOURCES
    int step = c0 * KI;  // first 128-input step of the next chunk to load
    const u32 w_off = X_BYTES + ((warp * RT) * KI * 32 + lane) * 16;
    const u32 s_off = X_BYTES + W_BYTES + ((warp * RT) * NGC * 8 + lane * 4) * 4;

    auto load_stage = [&](int st) {
        const u32 sb = base + st * STAGE;
        const int xbytes = xk < K ? 16 : 0;
#pragma unroll
        for (int v = 0; v < XPT; ++v)
            if (xlive & (1u << v))
                cp_async16(sb + xs_off + v * RSTEP * LDS * 2, xbytes ? xsrc + (long)v * RSTEP * K : x, xbytes);
        STAGE_CODES(sb)
        xsrc += KC;
        xk += KC;
        step += KI;
    };

#pragma unroll
    for (int s = 0; s < ST - 1; ++s) {
        if (c0 + s < c1) load_stage(s);
        cp_async_commit();
    }
    int st_use = 0, st_fill = ST - 1;
    for (int c = c0; c < c1; ++c) {
        cp_async_wait<ST - 2>();
        __syncthreads();
        if (c + ST - 1 < c1) load_stage(st_fill);
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
                u32 sw[RT];  // the scale words of this word's group
#pragma unroll
                for (int r = 0; r < RT; ++r) sw[r] = FOLD ? 0u : scale_word(sb, r, word / WPG, row_scale[r]);
                // the two k16 steps of word j, one after the other: B fragments of step s for all MT
                // token tiles, then for each row tile the four A registers of step s and MT MMAs
#pragma unroll
                for (int s = 0; s < 2; ++s) {
                    u32 b[MT][2];
                    const int kk = i * 128 + j * 32 + s * 16;
                    if (MT == 1) {
                        const int mat = (lane >> 3) & 1;
                        ldmatrix_x2(sb + ((lane & 7) * LDS + kk + mat * 8) * 2, b[0][0], b[0][1]);
                    } else {
#pragma unroll
                        for (int p = 0; p < MT / 2; ++p) {
                            const int mat = lane >> 3;
                            const int row = (2 * p + (mat >> 1)) * 8 + (lane & 7);
                            ldmatrix_x4(sb + (row * LDS + kk + (mat & 1) * 8) * 2, b[2 * p][0], b[2 * p][1],
                                        b[2 * p + 1][0], b[2 * p + 1][1]);
                        }
                    }
                    if (FOLD) {
#pragma unroll
                        for (int tt = 0; tt < MT; ++tt)
                            if (word % FIX == 0) mma_bf16_first(xsum[s][tt], ones, b[tt][0], b[tt][1]);
                            else mma_bf16(xsum[s][tt], ones, b[tt][0], b[tt][1]);
                    }
#pragma unroll
                    for (int r = 0; r < RT; ++r) {  // a tile past N multiplies stale shared memory, never stored
                        const u32 w = j == 0 ? wv[r].x : j == 1 ? wv[r].y : j == 2 ? wv[r].z : wv[r].w;
                        u32 a[4];
                        if (FOLD) decode_raw(w, s, mask, a);
                        else decode(w, s, splat_lo(sw[r]), splat_hi(sw[r]), mask, a);
#pragma unroll
                        for (int tt = 0; tt < MT; ++tt)
                            if (!FOLD) mma_bf16(acc[r][tt], a, b[tt][0], b[tt][1]);
                            else if (word % FIX == 0) mma_bf16_first(tmp[s][r][tt], a, b[tt][0], b[tt][1]);
                            else mma_bf16(tmp[s][r][tt], a, b[tt][0], b[tt][1]);
                    }
                }
                if (FOLD && (word + 1) % FIX == 0) {
#pragma unroll
                    for (int r = 0; r < RT; ++r) {
                        const u32 gw = scale_word(sb, r, word / WPG, row_scale[r]);
                        const float s0 = __uint_as_float(gw << 16), s1 = __uint_as_float(gw & 0xFFFF0000u);
#pragma unroll
                        for (int tt = 0; tt < MT; ++tt)
#pragma unroll
                            for (int e = 0; e < 4; ++e) {
                                const float v = tmp[0][r][tt][e] + tmp[1][r][tt][e];
                                acc[r][tt][e] += (e < 2 ? s0 : s1) * fmaf(-129.f, xsum[0][tt][e] + xsum[1][tt][e], v);
                            }
                    }
                }
            }
        }
    }
    cp_async_wait<0>();

    // epilogue: c0/c1 are row g, tokens 2t and 2t + 1; c2/c3 row g + 8. One split writes
    // the output; several add into the workspace, and the last one writes the output.
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
        for (int tt = 0; tt < MT; ++tt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int n = (tile0 + r) * 16 + g + (e >> 1) * 8;
                const int m = tt * 8 + 2 * t + (e & 1);
                if (n >= N || m >= M) continue;
                if (splits == 1) y[(long)m * N + n] = f32_to_bf16(acc[r][tt][e]);
                else red_add(ws + (long)m * N + n, acc[r][tt][e]);
            }
    if (splits > 1) splitk_finish(y, ws, locks, M, N, NW * RT * 16, splits);
}
