// trit's CPU ternary linear: y = x @ W.T (+ bias) reading the packed 2-bit codes directly.
//
// Activations are rounded to integers: int16 with one scale per token and 64-input chunk (so an outlier channel,
// which SmolLM2's activations have, costs precision in its own chunk only), or int8 per token by BitNet's rule for
// W1.58A8; the codes
// c = w + 1 (0, 1, 2) meet them in integer multiply-adds:  sum_k w_k x_k = sum_k c_k x_k - sum_k x_k,  the second
// sum once per token and group. A chunk of codes (16 bytes: 64 weights) is widened to 16-bit lanes, lane j
// holding byte j, and `(lane >> 2i) & 3` is the code of weight 4j + i. The activations are laid out to match once
// per call (plane i holds x[4j + i] at j), so no weight is ever moved. `madd` pairs lanes 2l, 2l+1: int32 lane l
// sums weights 8l..8l+7 of the chunk, all of one group (groups are powers of two, at least 32), so each lane is
// scaled by its group's scale times its chunk's activation scale in float, and the row summed at the end. (Splitting each activation into two signed
// bytes for `maddubs` issues fewer instructions but more multiplies; it measured slower here: the multiply ports
// are the limit.)
// Rows are shared among threads (at::parallel_for). AVX2 (with FMA and F16C), checked at run time; an AVX-512
// VNNI path (32-byte chunks, dpwssd) is not here: no machine this project tests on has AVX-512 to check it.
#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <vector>

namespace {

constexpr int kMaxTile = 8;  // tokens sharing one widening of each chunk of codes

// One row's scales as float32 (F16C for fp16, a shift for bf16), written into `out` (G floats).
template <typename S>
void row_scales(const S* s, int64_t groups, float* out);
template <>
__attribute__((target("avx2,f16c"))) void row_scales<at::Half>(const at::Half* s, int64_t groups, float* out) {
  int64_t g = 0;
  for (; g + 8 <= groups; g += 8)
    _mm256_storeu_ps(out + g, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + g))));
  for (; g < groups; ++g) out[g] = static_cast<float>(s[g]);
}
template <>
void row_scales<at::BFloat16>(const at::BFloat16* s, int64_t groups, float* out) {
  for (int64_t g = 0; g < groups; ++g) out[g] = static_cast<float>(s[g]);
}
template <>
void row_scales<float>(const float* s, int64_t groups, float* out) {
  for (int64_t g = 0; g < groups; ++g) out[g] = s[g];
}

struct Quantized {
  std::vector<int16_t> planes;  // [M][4][KB]: plane i of token m holds x_int[4j + i] at j, zero past K
  std::vector<float> inv;       // [M][C]: chunk c (inputs 64c..64c+63) of token m is x ~ x_int * inv
  std::vector<float> sums;      // [M][G]: each group's sum of x_int * inv (the rounded activations, in float)
};

// int16: each token's 64-input chunk to 32767 at its largest magnitude; int8: BitNet b1.58's rule per token.
Quantized quantize_rows(const float* x, int64_t m, int64_t k, int64_t kb, int64_t groups, int64_t gw, bool int8) {
  const int64_t chunks = kb / 16;
  Quantized q;
  q.planes.assign(m * 4 * kb, 0);
  q.inv.assign(m * chunks, 0.f);
  q.sums.assign(m * groups, 0.f);
  for (int64_t r = 0; r < m; ++r) {
    const float* row = x + r * k;
    float token_max = 0.f;
    if (int8)
      for (int64_t i = 0; i < k; ++i) token_max = std::max(token_max, std::fabs(row[i]));
    int16_t* planes = q.planes.data() + r * 4 * kb;
    float* sums = q.sums.data() + r * groups;
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t i0 = 64 * c, i1 = std::min(k, i0 + 64);
      float s = 0.f;  // x_int = round(x * s)
      if (int8) {
        s = 127.f / std::max(token_max, 1e-5f);
      } else {
        float amax = 0.f;
        for (int64_t i = i0; i < i1; ++i) amax = std::max(amax, std::fabs(row[i]));
        s = amax > 0.f ? 32767.f / amax : 0.f;
      }
      const float inv = s > 0.f ? 1.f / s : 0.f;
      q.inv[r * chunks + c] = inv;
      for (int64_t i = i0; i < i1; ++i) {
        float v = std::nearbyint(row[i] * s);
        if (int8) v = std::min(127.f, std::max(-128.f, v));
        const int16_t iv = static_cast<int16_t>(v);
        planes[(i & 3) * kb + (i >> 2)] = iv;
        sums[i / gw] += static_cast<float>(iv) * inv;
      }
    }
  }
  return q;
}

// ---------------------------------------------------------------------------- AVX2: 16-byte chunks

template <typename S, int T>
__attribute__((target("avx2,fma,f16c"))) void rows_avx2(const uint8_t* codes, const S* scale, const Quantized& q,
                                                         int64_t m0, int64_t kb, int64_t groups, int64_t gw,
                                                         int64_t n0, int64_t n1, float* y, int64_t n) {
  const __m256i three = _mm256_set1_epi16(3);
  const int shift = groups == 1 ? 62 : __builtin_ctzll(gw);  // weight -> group: a shift (groups are powers of two)
  std::vector<float> sf(groups + 1);  // this row's scales in float32 (one spare for the two-group chunk's read)
  for (int64_t r = n0; r < n1; ++r) {
    const uint8_t* row = codes + r * kb;
    row_scales(scale + r * groups, groups, sf.data());
    __m256 acc[T];
    for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < kb; b += 16) {
      const __m256i v = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + b)));
      // code i of each byte: (v >> 2i) & 3; the widened byte is below 256, so the top code needs no mask
      const __m256i c[4] = {_mm256_and_si256(v, three), _mm256_and_si256(_mm256_srli_epi16(v, 2), three),
                            _mm256_and_si256(_mm256_srli_epi16(v, 4), three), _mm256_srli_epi16(v, 6)};
      // lanes 0-3 hold weights 0..31 of the chunk, 4-7 weights 32..63: two groups when gw == 32
      const int64_t g0 = (4 * b) >> shift;
      const __m256 sv = gw == 32 ? _mm256_set_m128(_mm_broadcast_ss(&sf[g0 + 1]), _mm_broadcast_ss(&sf[g0]))
                                 : _mm256_broadcast_ss(&sf[g0]);
      for (int t = 0; t < T; ++t) {
        const int16_t* planes = q.planes.data() + (m0 + t) * 4 * kb + b;
        const __m256 scaled = _mm256_mul_ps(sv, _mm256_broadcast_ss(&q.inv[(m0 + t) * (kb / 16) + b / 16]));
        __m256i s32 = _mm256_madd_epi16(c[0], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(planes)));
        for (int i = 1; i < 4; ++i)
          s32 = _mm256_add_epi32(s32, _mm256_madd_epi16(
                                          c[i], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(planes + i * kb))));
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s32), scaled, acc[t]);
      }
    }
    for (int t = 0; t < T; ++t) {
      const float* sums = q.sums.data() + (m0 + t) * groups;
      __m256 corr = _mm256_setzero_ps();
      int64_t g = 0;
      for (; g + 8 <= groups; g += 8)
        corr = _mm256_fmadd_ps(_mm256_loadu_ps(sf.data() + g), _mm256_loadu_ps(sums + g), corr);
      const __m256 d = _mm256_sub_ps(acc[t], corr);
      const __m128 h = _mm_add_ps(_mm256_castps256_ps128(d), _mm256_extractf128_ps(d, 1));
      const __m128 h2 = _mm_add_ps(h, _mm_movehl_ps(h, h));
      float dot = _mm_cvtss_f32(_mm_add_ss(h2, _mm_shuffle_ps(h2, h2, 1)));
      for (; g < groups; ++g) dot -= sf[g] * sums[g];
      y[(m0 + t) * n + r] = dot;
    }
  }
}

bool has_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                          __builtin_cpu_supports("f16c");
  return yes;
}

template <typename S, int T>
void run_tile(const uint8_t* codes, const S* scale, const Quantized& q, int64_t m0, int64_t kb, int64_t groups,
              int64_t gw, float* y, int64_t n) {
  at::parallel_for(0, n, 16, [&](int64_t n0, int64_t n1) {
    rows_avx2<S, T>(codes, scale, q, m0, kb, groups, gw, n0, n1, y, n);
  });
}

template <typename S>
void run(const uint8_t* codes, const S* scale, const Quantized& q, int64_t m, int64_t kb, int64_t groups, int64_t gw,
         float* y, int64_t n) {
  int64_t m0 = 0;
  for (; m0 + 8 <= m; m0 += 8) run_tile<S, 8>(codes, scale, q, m0, kb, groups, gw, y, n);
  for (; m0 + 4 <= m; m0 += 4) run_tile<S, 4>(codes, scale, q, m0, kb, groups, gw, y, n);
  for (; m0 + 2 <= m; m0 += 2) run_tile<S, 2>(codes, scale, q, m0, kb, groups, gw, y, n);
  for (; m0 < m; m0 += 1) run_tile<S, 1>(codes, scale, q, m0, kb, groups, gw, y, n);
}

}  // namespace

std::string isa() { return has_avx2() ? "avx2" : "none"; }

// x (M, K) float32, packed (N, K_pad / 4) uint8, scale (N, G) fp16/bf16/fp32; group: inputs a scale (K_pad for one
// a row). Returns (M, N) float32.
torch::Tensor linear(torch::Tensor x, torch::Tensor packed, torch::Tensor scale, int64_t group, bool int8) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat && x.is_contiguous(), "x: (M, K) float32, contiguous");
  TORCH_CHECK(packed.dim() == 2 && packed.scalar_type() == torch::kByte && packed.is_contiguous(), "packed: uint8");
  TORCH_CHECK(scale.dim() == 2 && scale.is_contiguous() && scale.size(0) == packed.size(0), "scale: (N, G)");
  const int64_t m = x.size(0), k = x.size(1), n = packed.size(0), kb = packed.size(1), groups = scale.size(1);
  TORCH_CHECK(kb % 16 == 0 && k <= 4 * kb, "K_pad must be a multiple of 64 and hold K");
  TORCH_CHECK(groups * group == 4 * kb && (groups == 1 || (group >= 32 && (group & (group - 1)) == 0)),
              "group: a power of two >= 32, or the whole row");
  TORCH_CHECK(has_avx2(), "the CPU has no AVX2 (with FMA and F16C)");
  const Quantized q = quantize_rows(x.data_ptr<float>(), m, k, kb, groups, group, int8);
  auto y = torch::empty({m, n}, x.options());
  const uint8_t* codes = packed.data_ptr<uint8_t>();
  switch (scale.scalar_type()) {
    case torch::kHalf:
      run(codes, scale.data_ptr<at::Half>(), q, m, kb, groups, group, y.data_ptr<float>(), n);
      break;
    case torch::kBFloat16:
      run(codes, scale.data_ptr<at::BFloat16>(), q, m, kb, groups, group, y.data_ptr<float>(), n);
      break;
    case torch::kFloat:
      run(codes, scale.data_ptr<float>(), q, m, kb, groups, group, y.data_ptr<float>(), n);
      break;
    default:
      TORCH_CHECK(false, "scale: float16, bfloat16 or float32");
  }
  return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, mod) {
  mod.def("linear", &linear, "ternary linear on packed codes (see trit/kernels/cpu_native.py)");
  mod.def("isa", &isa, "the instruction set the kernel runs with here");
}
