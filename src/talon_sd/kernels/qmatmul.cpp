// Quantized-weight matmuls for CPU decoding with float32 activations (AVX2 + FMA; the int4 tile's integer dots
// with AVX512-VNNI where the CPU has it: the same sums, exact either way): talon_sd.kernels.
//
// y[m, n] = sum_k x[m, k] * w[n, k], with w stored as
//   int4:  w = (q - 8) * scale + zero per group of 32 inputs (q in 0..15; scale, zero bfloat16), in tiles of eight
//          outputs: per tile and group 128 bytes (int4_tile says which nibble holds which weight) and eight scales
//          and zeros (talon_sd.kernels.pack_int4);
//   int8:  w = q * scale per output row (q in -127..127, scale float32), padded with zero groups to a whole
//          number of blocks of 8 groups (talon_sd.kernels.padded_groups, pad_columns).
// Each row of x is quantized to int8 per group of 32 (scale = max |x| / 127, x * (1 / scale) rounded to nearest
// even: talon_sd.kernels.as_quantized does the same in torch); a group's products sum_j q_w[j] * q_x[j] are exact
// in int32, then scaled in float32. A row's result depends on that row and the weight only, never on the other
// rows of the call, and its summation order is fixed (one thread computes all of an output).
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <type_traits>

namespace {

constexpr int64_t kGroup = 32;  // inputs per group
constexpr int64_t kBlock = 8;   // groups scaled together (one float32 vector)
constexpr int kRows = 4;        // activation rows per pass over an int8 weight row
#ifdef __AVX512VL__  // 32 vector registers: eight rows' accumulators beside the tile's unpacked weights
constexpr int kTileRows = 8;    // int4 tile: rows per pass (EPYC VNNI, 16 x [1536, 8960]: 1.22 -> 0.97 ms)
#else
constexpr int kTileRows = 4;
#endif
constexpr int64_t kAhead = 2048;  // bytes of weights prefetched ahead of the block being read

inline int64_t padded(int64_t groups) { return (groups + kBlock - 1) / kBlock * kBlock; }  // whole blocks of 8

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

// Eight vectors of 8 int32 d0..d7 -> one vector of their eight totals, in order, folded in three steps with unpacks
// and adds (cheaper than hadd here): fold2(d0, d1) holds d0's and d1's lanes summed by pairs, fold4 of two such
// pairs holds four vectors' partial totals per 128-bit half, fold8 adds the halves.
inline __m256i fold2(__m256i a, __m256i b) {
  return _mm256_add_epi32(_mm256_unpacklo_epi32(a, b), _mm256_unpackhi_epi32(a, b));
}
inline __m256i fold4(__m256i a, __m256i b) {
  return _mm256_add_epi32(_mm256_unpacklo_epi64(a, b), _mm256_unpackhi_epi64(a, b));
}
inline __m256i fold8(__m256i a, __m256i b) {
  return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
}
inline __m256i totals(const __m256i* d) {
  return fold8(fold4(fold2(d[0], d[1]), fold2(d[2], d[3])), fold4(fold2(d[4], d[5]), fold2(d[6], d[7])));
}

inline __m256 bf16x8(const uint16_t* p) {  // eight bfloat16 -> float32
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// The quantized activations of a call, G padded to whole blocks with zeros.
struct Rows {
  int64_t groups;  // padded G
  torch::Tensor q, scale, sum;  // [M, groups * 32] int8, [M, groups] float, [M, groups] float (scale * sum q)
  int8_t* q_data;  // their data, taken once (data_ptr<T>() checks the tensor on every call: ~100 cycles an output)
  float *scale_data, *sum_data;
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
  const int64_t M = x.size(0), K = x.size(1), groups = padded(K / kGroup);
  Rows rows{groups, torch::empty({M, groups * kGroup}, torch::kInt8), torch::empty({M, groups}, torch::kFloat),
            torch::empty({M, groups}, torch::kFloat), nullptr, nullptr, nullptr};
  rows.q_data = rows.q.data_ptr<int8_t>();
  rows.scale_data = rows.scale.data_ptr<float>();
  rows.sum_data = rows.sum.data_ptr<float>();
  const float* xs = x.data_ptr<float>();
  const int64_t used = K / kGroup;  // the groups past it pad: zeros
  for (int64_t m = 0; m < M; ++m) {
    int8_t* q = rows.q_data + m * groups * kGroup;
    float *scale = rows.scale_data + m * groups, *sum = rows.sum_data + m * groups;
    quantize_row(xs + m * K, K, q, scale, sum);
    std::fill(q + used * kGroup, q + groups * kGroup, int8_t{0});
    std::fill(scale + used, scale + groups, 0.0f);
    std::fill(sum + used, sum + groups, 0.0f);
  }
  return rows;
}

// x checked against a weight of padded_groups groups, then quantized
Rows quantize_checked(const torch::Tensor& x, int64_t padded_groups, const char* name) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat && x.is_contiguous() && x.device().is_cpu(),
              name, ": x must be a contiguous float32 CPU tensor");
  const int64_t K = x.size(1), groups = padded(K / kGroup);
  TORCH_CHECK(K % kGroup == 0 && groups == padded_groups, name, ": x has ", K,
              " columns, not a multiple of 32 or not the weight's (", padded_groups, " padded groups)");
  return quantize(x);
}

// The eight groups' products of one block, in order: dot(j, x) gives group j's 8 int32 sums of four products
// with the activations x (32 int8).
template <typename Dot>
inline __m256i block_dots(const int8_t* a, const Dot& dot) {
  __m256i d[kBlock];
#pragma GCC unroll 8
  for (int j = 0; j < kBlock; ++j) {
    d[j] = dot(j, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + j * kGroup)));
  }
  return totals(d);
}

// Eight outputs 8t .. 8t + 7 (one tile) of the int4 weight for R activation rows starting at m0, one float32 lane
// per output: per group, each row's 32 int8 activations are broadcast four at a time against the tile's four
// 32-byte vectors (byte 4c + j of vector v: output c's input 4v + j in the low nibble, 4v + 16 + j in the high),
// the pair sums added in int16 (at most 8 * 2 * 15 * 127, no overflow), then per lane in int32, scaled in float32.
template <int R>
void int4_tile(const uint8_t* wt, const uint16_t* st, const uint16_t* zt, int64_t G, const Rows& rows, int64_t m0,
               float* out, int64_t N, int64_t n0) {
  const int64_t Gp = rows.groups;
  const __m256i low = _mm256_set1_epi8(0x0F);
  [[maybe_unused]] const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t g = 0; g < G; ++g) {
    const uint8_t* w = wt + g * 128;
    _mm_prefetch(reinterpret_cast<const char*>(w + kAhead), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(w + kAhead + 64), _MM_HINT_T0);
    __m256i first[4], second[4];
    for (int v = 0; v < 4; ++v) {
      const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 32 * v));
      first[v] = _mm256_and_si256(b, low);
      second[v] = _mm256_and_si256(_mm256_srli_epi16(b, 4), low);
    }
    const __m256 s8 = bf16x8(st + g * 8);
    const __m256 o8 = _mm256_fnmadd_ps(_mm256_set1_ps(8.0f), s8, bf16x8(zt + g * 8));  // w = q * s + (z - 8 s)
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const int64_t m = m0 + r;
      const int32_t* x = reinterpret_cast<const int32_t*>(rows.q_data + (m * Gp + g) * kGroup);  // 8 quads
#ifdef __AVX512VNNI__  // the same integer sums, four products a lane per instruction, in two independent chains
      __m256i low_sums = _mm256_dpbusd_epi32(_mm256_setzero_si256(), first[0], _mm256_set1_epi32(x[0]));
      __m256i high_sums = _mm256_dpbusd_epi32(_mm256_setzero_si256(), second[0], _mm256_set1_epi32(x[4]));
      for (int v = 1; v < 4; ++v) {
        low_sums = _mm256_dpbusd_epi32(low_sums, first[v], _mm256_set1_epi32(x[v]));
        high_sums = _mm256_dpbusd_epi32(high_sums, second[v], _mm256_set1_epi32(x[4 + v]));
      }
      const __m256i sums = _mm256_add_epi32(low_sums, high_sums);
#else
      __m256i pairs = _mm256_maddubs_epi16(first[0], _mm256_set1_epi32(x[0]));
      for (int v = 1; v < 4; ++v) pairs = _mm256_add_epi16(pairs, _mm256_maddubs_epi16(first[v], _mm256_set1_epi32(x[v])));
      for (int v = 0; v < 4; ++v) pairs = _mm256_add_epi16(pairs, _mm256_maddubs_epi16(second[v], _mm256_set1_epi32(x[4 + v])));
      const __m256i sums = _mm256_madd_epi16(pairs, ones);
#endif
      const __m256 dots = _mm256_cvtepi32_ps(sums);
      acc[r] = _mm256_fmadd_ps(dots, _mm256_mul_ps(s8, _mm256_set1_ps(rows.scale_data[m * Gp + g])), acc[r]);
      acc[r] = _mm256_fmadd_ps(o8, _mm256_set1_ps(rows.sum_data[m * Gp + g]), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    float* y = out + (m0 + r) * N + n0;
    if (n0 + 8 <= N) {
      _mm256_storeu_ps(y, acc[r]);
    } else {
      alignas(32) float lanes[8];
      _mm256_store_ps(lanes, acc[r]);
      std::copy(lanes, lanes + (N - n0), y);
    }
  }
}

// One output n of the int8 weight for R activation rows starting at m0 (Gp groups, whole blocks).
template <int R>
void int8_output(const int8_t* wn, float scale, const Rows& rows, int64_t m0, float* out, int64_t N, int64_t n) {
  const int8_t* aq = rows.q_data;
  const float* as = rows.scale_data;
  const int64_t Gp = rows.groups;
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t g0 = 0; g0 < Gp; g0 += kBlock) {
    for (int line = 0; line < 4; ++line) {
      _mm_prefetch(reinterpret_cast<const char*>(wn + g0 * kGroup + kAhead + 64 * line), _MM_HINT_T0);
    }
    __m256i w[kBlock], magnitude[kBlock];  // the block's weights and |w|, read once for every row
#pragma GCC unroll 8
    for (int j = 0; j < kBlock; ++j) {
      w[j] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wn + (g0 + j) * kGroup));
      magnitude[j] = _mm256_sign_epi8(w[j], w[j]);
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const int64_t m = m0 + r;
      const __m256i dots = block_dots(aq + (m * Gp + g0) * kGroup, [&](int j, __m256i x) {  // |w| times x signed as w
#ifdef __AVX512VNNI__  // the same sums, four products a lane per instruction
        return _mm256_dpbusd_epi32(_mm256_setzero_si256(), magnitude[j], _mm256_sign_epi8(x, w[j]));
#else
        return _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude[j], _mm256_sign_epi8(x, w[j])), _mm256_set1_epi16(1));
#endif
      });
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dots), _mm256_loadu_ps(as + m * Gp + g0), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) out[(m0 + r) * N + n] = hsum(acc[r]) * scale;
}

// f(std::integral_constant<int, rows>) for 1 <= rows <= R (a compile-time row count)
template <int R, typename F>
void dispatch(int64_t rows, const F& f) {
  if constexpr (R > 1) {
    if (rows < R) return dispatch<R - 1>(rows, f);
  }
  f(std::integral_constant<int, R>{});
}

// calls output(m0, std::integral_constant<int, R>) over chunks of R <= kMax rows
template <int kMax, typename Output>
void for_rows(int64_t M, const Output& output) {
  for (int64_t m0 = 0; m0 < M; m0 += kMax) {
    dispatch<kMax>(std::min<int64_t>(kMax, M - m0), [&](auto R) { output(m0, R); });
  }
}

}  // namespace

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
      for_rows<kRows>(M, [&](int64_t m0, auto R) { int8_output<decltype(R)::value>(wn, ws[n], rows, m0, out, N, n); });
    }
  });
  return y;
}

// x [M, K] float32, packed [T, G, 128] uint8 (T = ceil(N / 8) tiles of eight outputs, G = K / 32), scale and zero
// [T, G, 8] bfloat16 -> [M, N] float32
torch::Tensor int4_matmul(torch::Tensor x, torch::Tensor packed, torch::Tensor scale, torch::Tensor zero, int64_t N) {
  const int64_t M = x.size(0), T = packed.size(0), G = packed.size(1);
  TORCH_CHECK(x.dim() == 2 && x.size(1) == G * kGroup, "int4_matmul: x must be [M, K] with K = 32 * groups");
  const Rows rows = quantize_checked(x, padded(G), "int4_matmul");
  TORCH_CHECK(packed.scalar_type() == torch::kUInt8 && packed.is_contiguous() && packed.size(2) == 128
              && (N + 7) / 8 == T, "int4_matmul: packed uint8 [ceil(N / 8), G, 128]");
  TORCH_CHECK(scale.scalar_type() == torch::kBFloat16 && zero.scalar_type() == torch::kBFloat16
              && scale.is_contiguous() && zero.is_contiguous() && scale.size(0) == T && scale.size(1) == G
              && scale.size(2) == 8 && zero.sizes() == scale.sizes(), "int4_matmul: scale and zero bfloat16 [T, G, 8]");
  torch::Tensor y = torch::empty({M, N}, torch::kFloat);
  const uint8_t* w = packed.data_ptr<uint8_t>();
  const uint16_t* ws = reinterpret_cast<const uint16_t*>(scale.data_ptr<at::BFloat16>());
  const uint16_t* wz = reinterpret_cast<const uint16_t*>(zero.data_ptr<at::BFloat16>());
  float* out = y.data_ptr<float>();
  at::parallel_for(0, T, 4, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      for_rows<kTileRows>(M, [&](int64_t m0, auto R) {
        int4_tile<decltype(R)::value>(w + t * G * 128, ws + t * G * 8, wz + t * G * 8, G, rows, m0, out, N, 8 * t);
      });
    }
  });
  return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.def("int4_matmul", &int4_matmul, "x [M, K] f32 times int4 groups of 32 in tiles of 8 outputs [N, K] -> [M, N] f32");
  module.def("int8_matmul", &int8_matmul, "x [M, K] f32 times int8 per row [N, K] -> [M, N] f32");
}
