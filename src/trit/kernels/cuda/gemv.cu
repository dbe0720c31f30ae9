// trit_gemv: y[M, N] = x[M, K] @ W.T for a few tokens (M <= 4), on CUDA cores, from the same load-time
// "mma" layout as trit_mma (trit/kernels/cuda/mma.py documents it), near memory bandwidth.
//
// The activations are rounded per 128-input step to 15-bit integers against the step's largest
// (x ~= xi * inv, inv a power of two), once a block, into shared memory, ordered so that one 16-byte
// load gives a lane the int16 pairs its codes meet. In a word of the layout, byte b of
// ``word & (0x03030303 << 2k)`` holds, times 4^k, the code of register k (b = 0, 2: first, second
// element) or 4 + k (b = 1, 3) of the MMA fragment: registers k and 4 + k share a row (g for k = 0, 2;
// g + 8 for k = 1, 3) and lie 16 inputs apart. So dp2a.lo multiplies bytes 0 and 1 with the int16 pair of
// their two inputs, dp2a.hi bytes 2 and 3, and the pair of dp2a chains into one int32 sum per k: four
// logic ops and eight dp2a a word of 16 weights, nothing else. Once a scale group (or a step, when a group
// is larger) the sums become floats: row g's is 16 * sum(c x) / inv from k = 0, 2, row g + 8's 64 * sum
// from k = 1, 3; the codes c = w + 1 give sum (c - 1) x = sum c x - sum x, with sum x over the group taken
// off once (by the quad's first lane). The four lanes of a quad hold the same rows and are added with two
// shuffles at the end.
//
// Codes and scales are read straight from global memory into registers, PF steps ahead (the first PF steps
// before the activations are rounded). Split-K adds
// into an fp32 workspace with red.add, and the last block of a row block writes the output and zeroes its
// workspace and counter (as trit_mma does; they share the workspace). No headers: compiled by NVRTC after common.cuh.

__device__ __forceinline__ int dp2a_lo(u32 a, u32 b, int c) {
    int d;
    asm("dp2a.lo.s32.u32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

__device__ __forceinline__ int dp2a_hi(u32 a, u32 b, int c) {
    int d;
    asm("dp2a.hi.s32.u32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

// MG: tokens (M <= MG); RT: 16-row tiles a warp; GS: inputs a scale (32, 64, 128; 0 = one scale a row);
// NW: warps a block (they share the quantized activations); PF: steps of codes loaded ahead.
template <int MG, int RT, int GS, int NW, int PF>
__global__ void __launch_bounds__(NW * 32) trit_gemv(const U4* __restrict__ wq, const u32* __restrict__ sc,
                                                 const u16* __restrict__ x, u16* __restrict__ y,
                                                 float* __restrict__ ws, int* __restrict__ locks, int M, int N,
                                                 int K, int KS, int GP, int steps_per_split, int splits) {
    constexpr int U = GS == 0 ? 4 : GS / 32;  // words a unit: a scale group, or a step when groups are larger
    constexpr int UPS = 4 / U;                 // units a step
    // shared memory, a record a step: int16 pairs [4 words][MG][4 t] x 16 B | the scales [MG] (inv/16, inv/64) |
    // the unit sums [UPS][MG] (sum x, f32), padded to 16 bytes
    constexpr int XS_OFF = 256 * MG, XU_OFF = XS_OFF + 8 * MG;
    constexpr int SB = (XU_OFF + 4 * UPS * MG + 15) / 16 * 16;
    extern __shared__ __align__(16) unsigned char smem[];

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int NT = (N + 15) >> 4;
    const int s0 = blockIdx.y * steps_per_split;
    const int s1 = min(KS, s0 + steps_per_split);
    const int nsteps = s1 - s0;

    // 1. The warp's row tiles (a tile past N reads the last one, and is never stored). Pointers advance a step
    // at a time; codes and scales are loaded PF steps ahead, into a ring of registers: the first PF steps before
    // the activations are rounded, so that their loads are in flight meanwhile.
    const int tile0 = (blockIdx.x * NW + warp) * RT;
    constexpr int NSC = GS == 0 ? 1 : UPS;  // scale words a step
    const U4* wp[RT];
    const u32* sp[RT];
    constexpr int RING = PF + 1;  // a slot beyond PF: a step's load goes to the slot the step before consumed
    U4 wbuf[RING][RT];
    u32 sbuf[RING][RT][NSC];
    u32 row_scale[RT];
#pragma unroll
    for (int r = 0; r < RT; ++r) {
        const int tile = min(tile0 + r, NT - 1);
        wp[r] = wq + ((long)tile * KS + s0) * 32 + lane;
        sp[r] = sc + ((long)tile * GP + (GS == 0 ? 0 : s0 * UPS)) * 8 + g;
        row_scale[r] = GS == 0 ? ldg32(sp[r]) : 0u;
#pragma unroll
        for (int p = 0; p < PF; ++p) {
            if (p < nsteps) wbuf[p][r] = ldg128(wp[r] + p * 32);
#pragma unroll
            for (int u = 0; u < NSC; ++u)
                if (GS != 0 && p < nsteps) sbuf[p][r][u] = ldg32(sp[r] + (p * UPS + u) * 8);
        }
        wp[r] += PF * 32;
        sp[r] += GS == 0 ? 0 : PF * UPS * 8;
    }

    // 2. Quantize this block's share of the activations: a warp a (step, token), four inputs a lane, QB jobs'
    // loads at once.
    for (int base = warp; base < nsteps * MG; base += QB * NW) {
        uint2 raw[QB];
#pragma unroll
        for (int q = 0; q < QB; ++q) {
            const int job = base + q * NW;
            raw[q] = job < nsteps * MG ? load_x4(x, job % MG, M, K, (s0 + job / MG) * 128 + 4 * lane) : make_uint2(0u, 0u);
        }
#pragma unroll
        for (int q = 0; q < QB; ++q) {
            const int job = base + q * NW;
            if (job >= nsteps * MG) break;
            const int i = job / MG, m = job % MG;
            unsigned char* rec = smem + i * SB;
            float v[4], up, inv;
            step_scale(raw[q], v, up, inv);
            short* pairs = reinterpret_cast<short*>(rec);
            int part = 0;
#pragma unroll
            for (int vv = 0; vv < 4; ++vv) {
                const int xi = __float2int_rn(v[vv] * up);
                part += xi;
                const int c32 = (4 * lane + vv) & 31, j = lane >> 3;
                const int s = c32 >> 4, h = (c32 >> 3) & 1, tt = (c32 & 7) >> 1, el = c32 & 1;
                pairs[(((j * MG + m) * 4 + tt) * 4 + el * 2 + h) * 2 + s] = (short)xi;
            }
#pragma unroll
            for (int o = 1; o < 8 * U; o <<= 1) part += __shfl_xor_sync(0xFFFFFFFFu, part, o);
            if (lane % (8 * U) == 0) reinterpret_cast<float*>(rec + XU_OFF)[(lane / (8 * U)) * MG + m] = (float)part * inv;
            if (lane == 0) {
                reinterpret_cast<float*>(rec + XS_OFF)[m * 2] = inv * 0.0625f;
                reinterpret_cast<float*>(rec + XS_OFF)[m * 2 + 1] = inv * 0.015625f;
            }
        }
    }
    __syncthreads();

    float accg[RT][MG], acch[RT][MG];
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
        for (int m = 0; m < MG; ++m) accg[r][m] = acch[r][m] = 0.f;
    const float first_lane = t == 0 ? 1.f : 0.f;  // the quad's first lane takes off sum x

    u32 rec = (u32)__cvta_generic_to_shared(smem);
    for (int base = 0; base < nsteps; base += RING) {
#pragma unroll
        for (int p = 0; p < RING; ++p, rec += SB) {
            const int i = base + p;
            if (i >= nsteps) break;
            const U4* wv = wbuf[p];
            const u32(*sv)[NSC] = sbuf[p];
            const bool more = i + PF < nsteps;
            const int fill = (p + PF) % RING;  // a constant once the loop is unrolled
#pragma unroll
            for (int r = 0; r < RT; ++r) {
                if (more) wbuf[fill][r] = ldg128(wp[r]);
#pragma unroll
                for (int u = 0; u < NSC; ++u)
                    if (GS != 0 && more) sbuf[fill][r][u] = ldg32(sp[r] + u * 8);
                wp[r] += 32;
                sp[r] += GS == 0 ? 0 : UPS * 8;
            }
            const u32 lane_rec = rec + t * 16;
            int ia[RT][MG][4];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                U4 P[MG];
#pragma unroll
                for (int m = 0; m < MG; ++m) P[m] = lds128(lane_rec + (j * MG + m) * 64);
#pragma unroll
                for (int r = 0; r < RT; ++r) {
                    const u32 w = j == 0 ? wv[r].x : j == 1 ? wv[r].y : j == 2 ? wv[r].z : wv[r].w;
#pragma unroll
                    for (int k = 0; k < 4; ++k) {
                        const u32 mk = w & (0x03030303u << (2 * k));
#pragma unroll
                        for (int m = 0; m < MG; ++m) {
                            const u32 lo = k < 2 ? P[m].x : P[m].y, hi = k < 2 ? P[m].z : P[m].w;
                            const int c0 = j % U == 0 ? 0 : ia[r][m][k];
                            ia[r][m][k] = dp2a_hi(hi, mk, dp2a_lo(lo, mk, c0));
                        }
                    }
                }
                if ((j + 1) % U == 0) {  // a unit ends: to floats, less sum x, times the group scale
                    const int u = j / U;
                    float xsg[MG], xsh[MG], xo[MG];
#pragma unroll
                    for (int m = 0; m < MG; ++m) {
                        xsg[m] = lds32f(rec + XS_OFF + m * 8);
                        xsh[m] = lds32f(rec + XS_OFF + m * 8 + 4);
                        xo[m] = lds32f(rec + XU_OFF + (u * MG + m) * 4) * first_lane;
                    }
#pragma unroll
                    for (int r = 0; r < RT; ++r) {
                        const u32 sw = GS == 0 ? 0u : sv[r][u];
#pragma unroll
                        for (int m = 0; m < MG; ++m) {
                            const float dg = fmaf((float)((ia[r][m][0] << 4) + ia[r][m][2]), xsg[m], -xo[m]);
                            const float dh = fmaf((float)((ia[r][m][1] << 4) + ia[r][m][3]), xsh[m], -xo[m]);
                            if (GS == 0) {
                                accg[r][m] += dg;
                                acch[r][m] += dh;
                            } else {
                                accg[r][m] = fmaf(__uint_as_float(sw << 16), dg, accg[r][m]);
                                acch[r][m] = fmaf(__uint_as_float(sw & 0xFFFF0000u), dh, acch[r][m]);
                            }
                        }
                    }
                }
            }
        }
    }

    // 3. Add up the quad; lane t = 0 stores row g, t = 1 row g + 8.
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
        for (int m = 0; m < MG; ++m) {
            float a = accg[r][m], b = acch[r][m];
            a += __shfl_xor_sync(0xFFFFFFFFu, a, 1);
            b += __shfl_xor_sync(0xFFFFFFFFu, b, 1);
            a += __shfl_xor_sync(0xFFFFFFFFu, a, 2);
            b += __shfl_xor_sync(0xFFFFFFFFu, b, 2);
            if (GS == 0) {
                a *= bf16_to_f32((u16)(row_scale[r] & 0xFFFF));
                b *= bf16_to_f32((u16)(row_scale[r] >> 16));
            }
            const int n = (tile0 + r) * 16 + g + (t == 1 ? 8 : 0);
            if (t < 2 && m < M && n < N && tile0 + r < NT) {
                const float v = t == 0 ? a : b;
                if (splits == 1) y[(long)m * N + n] = f32_to_bf16(v);
                else red_add(ws + (long)m * N + n, v);
            }
        }
    if (splits > 1) splitk_finish(y, ws, locks, M, N, NW * RT * 16, splits);
}

// The dense bf16 weight (N, K) from the layout, for prefill (then cuBLAS): a warp a 16-row tile and 128-input
// step. Each lane decodes its four words into bf16 pairs ((c - 1) s, exact: a shift, a lop3 that makes the
// bf16 128 + c, an FMA to c - 1 and a multiply by the scale) in a shared-memory tile (rows padded to 68 words:
// no bank conflicts), then the warp writes the tile's 16 rows with 16-byte stores, 256 contiguous bytes a row.
__global__ void __launch_bounds__(128) trit_dequant(const U4* __restrict__ wq, const u32* __restrict__ sc,
                                                    u16* __restrict__ out, int N, int K, int KS, int GP, int GS) {
    constexpr int ROW = 68;  // words a tile row in shared memory: 64 pairs + 4 of padding
    __shared__ __align__(16) u32 tiles[4][16 * ROW];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const long job = (long)blockIdx.x * 4 + warp;  // (tile, step)
    const int NT = (N + 15) >> 4;
    if (job >= (long)NT * KS) return;  // the whole warp: no block-wide barrier follows
    const int step = (int)(job % KS), tile = (int)(job / KS);
    const int g = lane >> 2, t = lane & 3;
    const U4 v = wq[job * 32 + lane];
    const u32 words[4] = {v.x, v.y, v.z, v.w};
    u32* buf = tiles[warp];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const int col0 = step * 128 + j * 32;
        const u32 sw = sc[((long)tile * GP + (GS == 0 ? 0 : col0 / GS)) * 8 + g];
        const u32 sg = __byte_perm(sw, 0, 0x1010), sh = __byte_perm(sw, 0, 0x3232);
#pragma unroll
        for (int q = 0; q < 8; ++q) {
            const int r = q & 3, s = q >> 2;
            const u32 c = ((words[j] >> (2 * q)) & 0x00030003u) | BASE;
            buf[(g + (r & 1) * 8) * ROW + 16 * j + 8 * s + t + 4 * (r >> 1)] =
                fma_bf16x2(fma_bf16x2(c, ONE, M129), (r & 1) ? sh : sg, NEG_ZERO);
        }
    }
    __syncwarp();
#pragma unroll
    for (int c = lane; c < 256; c += 32) {
        const int row = c >> 4, chunk = c & 15;
        const int n = tile * 16 + row, col = step * 128 + chunk * 8;
        if (n < N && col < K)  // K % 8 == 0: a chunk of 8 is all in or all out
            *reinterpret_cast<U4*>(out + (long)n * K + col) = *reinterpret_cast<const U4*>(buf + row * ROW + chunk * 4);
    }
}
