// Quantized-weight matmuls for CPU decoding with float32 activations (AVX2 + FMA): talon_sd.kernels.
//
// y[m, n] = sum_k x[m, k] * w[n, k] for a few rows m, with w stored as
//   int4:  w = (q - 8) * scale + zero per group of 32 inputs (q in 0..15; scale, zero bfloat16), a pair of
//          groups in 32 bytes, byte j holding the first group's q[j] in its low nibble, the second's in its high;
//   int8:  w = q * scale per output row (q in -127..127, scale float32).
// Weights are padded with zero groups to a whole number of blocks of 8 groups (talon_sd.kernels.padded_groups, pad_columns).
// Each row of x is quantized to int8 per group of 32 (scale = max |x| / 127, x * (1 / scale) rounded to nearest
// even: talon_sd.kernels.as_quantized does the same in torch); a group's products sum_j q_w[j] * q_x[j] are exact
// in int32, then scaled in float32, eight groups at a time. A row's result depends on that row and the weight
// only, never on the other rows of the call, and its summation order is fixed (one thread computes all of an
// output n).
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <type_traits>

namespace {

constexpr int64_t kGroup = 32;  // inputs per group
constexpr int64_t kBlock = 8;   // groups scaled together (one float32 vector)
constexpr int kRows = 4;        // activation rows per pass over a weight row
constexpr int64_t kAhead = 2048;  // bytes of weights prefetched ahead of the block being read

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline int32_t hsum_i32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(s);
}

// eight vectors of 8 int32 -> one vector of their eight totals, in order
inline __m256i totals(const __m256i* d) {
  const __m256i h0123 = _mm256_hadd_epi32(_mm256_hadd_epi32(d[0], d[1]), _mm256_hadd_epi32(d[2], d[3]));
  const __m256i h4567 = _mm256_hadd_epi32(_mm256_hadd_epi32(d[4], d[5]), _mm256_hadd_epi32(d[6], d[7]));
  return _mm256_add_epi32(_mm256_permute2x128_si256(h0123, h4567, 0x20),
                          _mm256_permute2x128_si256(h0123, h4567, 0x31));
}

inline __m256 bf16x8(const uint16_t* p) {  // eight bfloat16 -> float32
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// The quantized activations of a call, G padded to whole blocks with zeros.
struct Rows {
  int64_t groups;  // padded G
  torch::Tensor q, scale, sum;  // [M, groups * 32] int8, [M, groups] float, [M, groups] float (scale * sum q)
};

// x [K] float -> q int8, per group scale and the quantized group's sum
void quantize_row(const float* x, int64_t K, int8_t* q, float* scale, float* sum) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t g = 0; g < K / kGroup; ++g) {
    const float* xg = x + g * kGroup;
    __m256 v[4];
    __m256 amax = _mm256_setzero_ps();
    for (int i = 0; i < 4; ++i) {
      v[i] = _mm256_loadu_ps(xg + 8 * i);
      amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[i]));
    }
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    const float s = _mm_cvtss_f32(m) / 127.0f;
    scale[g] = s;
    const __m256 inverse = _mm256_set1_ps(s > 0.0f ? 1.0f / s : 0.0f);
    __m256i i[4];
    for (int k = 0; k < 4; ++k) i[k] = _mm256_cvtps_epi32(_mm256_mul_ps(v[k], inverse));
    const __m256i quants = _mm256_add_epi32(_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3]));
    sum[g] = s * static_cast<float>(hsum_i32(quants));  // the quantized group's sum
    const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i[0], i[1]), _mm256_packs_epi32(i[2], i[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + g * kGroup), _mm256_permutevar8x32_epi32(p, order));
  }
}

Rows quantize(const torch::Tensor& x) {
  const int64_t M = x.size(0), K = x.size(1), groups = (K / kGroup + kBlock - 1) / kBlock * kBlock;
  Rows rows{groups, torch::zeros({M, groups * kGroup}, torch::kInt8), torch::zeros({M, groups}, torch::kFloat),
            torch::zeros({M, groups}, torch::kFloat)};
  for (int64_t m = 0; m < M; ++m) {
    quantize_row(x.data_ptr<float>() + m * K, K, rows.q.data_ptr<int8_t>() + m * groups * kGroup,
                 rows.scale.data_ptr<float>() + m * groups, rows.sum.data_ptr<float>() + m * groups);
  }
  return rows;
}

// x checked against a weight of padded_groups groups, then quantized
Rows quantize_checked(const torch::Tensor& x, int64_t padded_groups, const char* name) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat && x.is_contiguous() && x.device().is_cpu(),
              name, ": x must be a contiguous float32 CPU tensor");
  const int64_t K = x.size(1), groups = (K / kGroup + kBlock - 1) / kBlock * kBlock;
  TORCH_CHECK(K % kGroup == 0 && groups == padded_groups, name, ": x has ", K,
              " columns, not a multiple of 32 or not the weight's (", padded_groups, " padded groups)");
  return quantize(x);
}

// The eight groups' products of one block, in order: product(j, x) gives group j's 16 int16 pair sums with the
// activations x (32 int8).
template <typename Product>
inline __m256i block_dots(const int8_t* a, const Product& product) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i d[kBlock];
#pragma GCC unroll 8
  for (int j = 0; j < kBlock; ++j) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + j * kGroup));
    d[j] = _mm256_madd_epi16(product(j, x), ones);
  }
  return totals(d);
}

// One output n of the int4 weight for R activation rows starting at m0 (Gp groups, whole blocks).
template <int R>
void int4_output(const uint8_t* wn, const uint16_t* sn, const uint16_t* zn, const Rows& rows, int64_t m0,
                 float* out, int64_t N, int64_t n) {
  const int8_t* aq = rows.q.data_ptr<int8_t>();
  const float* as = rows.scale.data_ptr<float>();
  const float* asum = rows.sum.data_ptr<float>();
  const int64_t Gp = rows.groups;
  const __m256i low = _mm256_set1_epi8(0x0F);
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t g0 = 0; g0 < Gp; g0 += kBlock) {
    _mm_prefetch(reinterpret_cast<const char*>(wn + g0 * 16 + kAhead), _MM_HINT_T0);  // rows are contiguous:
    _mm_prefetch(reinterpret_cast<const char*>(wn + g0 * 16 + kAhead + 64), _MM_HINT_T0);  // read ahead
    _mm_prefetch(reinterpret_cast<const char*>(sn + g0 + kAhead / 8), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(zn + g0 + kAhead / 8), _MM_HINT_T0);
    __m256i w[kBlock];
#pragma GCC unroll 4
    for (int p = 0; p < kBlock / 2; ++p) {
      const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wn + (g0 + 2 * p) * 16));
      w[2 * p] = _mm256_and_si256(b, low);
      w[2 * p + 1] = _mm256_and_si256(_mm256_srli_epi16(b, 4), low);
    }
    const __m256 s8 = bf16x8(sn + g0);
    const __m256 o8 = _mm256_fnmadd_ps(_mm256_set1_ps(8.0f), s8, bf16x8(zn + g0));  // w = q * s + (z - 8 s)
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const int64_t m = m0 + r;
      const __m256 dots = _mm256_cvtepi32_ps(block_dots(aq + (m * Gp + g0) * kGroup, [&](int j, __m256i x) {
        return _mm256_maddubs_epi16(w[j], x);  // unsigned 4-bit q times signed int8 x
      }));
      acc[r] = _mm256_fmadd_ps(dots, _mm256_mul_ps(s8, _mm256_loadu_ps(as + m * Gp + g0)), acc[r]);
      acc[r] = _mm256_fmadd_ps(o8, _mm256_loadu_ps(asum + m * Gp + g0), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) out[(m0 + r) * N + n] = hsum(acc[r]);
}

// One output n of the int8 weight for R activation rows starting at m0 (Gp groups, whole blocks).
template <int R>
void int8_output(const int8_t* wn, float scale, const Rows& rows, int64_t m0, float* out, int64_t N, int64_t n) {
  const int8_t* aq = rows.q.data_ptr<int8_t>();
  const float* as = rows.scale.data_ptr<float>();
  const int64_t Gp = rows.groups;
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t g0 = 0; g0 < Gp; g0 += kBlock) {
    for (int line = 0; line < 4; ++line) {
      _mm_prefetch(reinterpret_cast<const char*>(wn + g0 * kGroup + kAhead + 64 * line), _MM_HINT_T0);
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const int64_t m = m0 + r;
      const __m256i dots = block_dots(aq + (m * Gp + g0) * kGroup, [&](int j, __m256i x) {
        const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wn + (g0 + j) * kGroup));
        return _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));  // |w| times x signed as w
      });
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dots), _mm256_loadu_ps(as + m * Gp + g0), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) out[(m0 + r) * N + n] = hsum(acc[r]) * scale;
}

// calls output(m0, std::integral_constant<int, R>) over chunks of R <= kRows rows (R a compile-time constant)
template <typename Output>
void for_rows(int64_t M, const Output& output) {
  for (int64_t m0 = 0; m0 < M; m0 += kRows) {
    switch (std::min<int64_t>(kRows, M - m0)) {
      case 1: output(m0, std::integral_constant<int, 1>{}); break;
      case 2: output(m0, std::integral_constant<int, 2>{}); break;
      case 3: output(m0, std::integral_constant<int, 3>{}); break;
      default: output(m0, std::integral_constant<int, kRows>{});
    }
  }
}

}  // namespace

// x [M, K] float32, packed [N, Gp * 16] uint8, scale and zero [N, Gp] bfloat16 (Gp: K / 32 padded to whole
// blocks) -> [M, N] float32
torch::Tensor int4_matmul(torch::Tensor x, torch::Tensor packed, torch::Tensor scale, torch::Tensor zero) {
  const int64_t N = packed.size(0), M = x.size(0);
  TORCH_CHECK(x.dim() == 2, "int4_matmul: x must be 2-D");
  const Rows rows = quantize_checked(x, packed.size(1) / 16, "int4_matmul");
  const int64_t G = rows.groups;
  TORCH_CHECK(packed.scalar_type() == torch::kUInt8 && packed.is_contiguous() && packed.size(1) == G * 16,
              "int4_matmul: packed uint8 [N, Gp * 16]");
  TORCH_CHECK(scale.scalar_type() == torch::kBFloat16 && zero.scalar_type() == torch::kBFloat16
              && scale.is_contiguous() && zero.is_contiguous() && scale.size(0) == N && scale.size(1) == G
              && zero.sizes() == scale.sizes(), "int4_matmul: scale and zero bfloat16 [N, Gp]");
  torch::Tensor y = torch::empty({M, N}, torch::kFloat);
  const uint8_t* w = packed.data_ptr<uint8_t>();
  const uint16_t* ws = reinterpret_cast<const uint16_t*>(scale.data_ptr<at::BFloat16>());
  const uint16_t* wz = reinterpret_cast<const uint16_t*>(zero.data_ptr<at::BFloat16>());
  float* out = y.data_ptr<float>();
  at::parallel_for(0, N, 16, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const uint8_t* wn = w + n * G * 16;
      const uint16_t *sn = ws + n * G, *zn = wz + n * G;
      for_rows(M, [&](int64_t m0, auto R) { int4_output<decltype(R)::value>(wn, sn, zn, rows, m0, out, N, n); });
    }
  });
  return y;
}

// x [M, K] float32, q [N, Gp * 32] int8 (Gp: K / 32 padded to whole blocks), scale [N] float32 -> [M, N] float32
torch::Tensor int8_matmul(torch::Tensor x, torch::Tensor q, torch::Tensor scale) {
  const int64_t N = q.size(0), M = x.size(0);
  TORCH_CHECK(x.dim() == 2, "int8_matmul: x must be 2-D");
  const Rows rows = quantize_checked(x, q.size(1) / kGroup, "int8_matmul");
  const int64_t G = rows.groups;
  TORCH_CHECK(q.scalar_type() == torch::kInt8 && q.is_contiguous() && q.size(1) == G * kGroup
              && scale.scalar_type() == torch::kFloat && scale.is_contiguous() && scale.numel() == N,
              "int8_matmul: q int8 [N, Gp * 32], scale float32 [N]");
  torch::Tensor y = torch::empty({M, N}, torch::kFloat);
  const int8_t* w = q.data_ptr<int8_t>();
  const float* ws = scale.data_ptr<float>();
  float* out = y.data_ptr<float>();
  at::parallel_for(0, N, 16, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const int8_t* wn = w + n * G * kGroup;
      for_rows(M, [&](int64_t m0, auto R) { int8_output<decltype(R)::value>(wn, ws[n], rows, m0, out, N, n); });
    }
  });
  return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.def("int4_matmul", &int4_matmul, "x [M, K] f32 times int4 groups of 32 [N, K] -> [M, N] f32");
  module.def("int8_matmul", &int8_matmul, "x [M, K] f32 times int8 per row [N, K] -> [M, N] f32");
}
