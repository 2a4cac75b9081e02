// Experiment (not part of normir; docs/results/2026-12-03-h200.md run ax): LayerNorm forward at N=65536 bf16 over a 4-block cluster,
// the committed shape (a block per row, 256 x 64 held) against persistent rows with the next
// row's x loaded ahead into registers and w, b held in registers or read through L1.
#include <cuda_bf16.h>
#include <cooperative_groups.h>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cmath>
#include <vector>
#include <algorithm>
namespace cg = cooperative_groups;
typedef __nv_bfloat16 bf16;
constexpr int N = 65536;

template <int WPC> struct Ld;
template <> struct Ld<4> {
  static __device__ __forceinline__ void na(uint32_t* w, const void* p) {
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3]) : "l"(p));
  }
  static __device__ __forceinline__ void ca(uint32_t* w, const void* p) {
    asm("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3]) : "l"(p));
  }
  static __device__ __forceinline__ void st(void* p, const uint32_t* w) {
    asm volatile("st.global.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(p), "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3]) : "memory");
  }
};
template <> struct Ld<2> {
  static __device__ __forceinline__ void na(uint32_t* w, const void* p) {
    asm("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];" : "=r"(w[0]), "=r"(w[1]) : "l"(p));
  }
  static __device__ __forceinline__ void ca(uint32_t* w, const void* p) {
    asm("ld.global.nc.v2.u32 {%0,%1}, [%2];" : "=r"(w[0]), "=r"(w[1]) : "l"(p));
  }
  static __device__ __forceinline__ void st(void* p, const uint32_t* w) {
    asm volatile("st.global.v2.u32 [%0], {%1,%2};" ::"l"(p), "r"(w[0]), "r"(w[1]) : "memory");
  }
};

__device__ __forceinline__ float2 unpack(uint32_t u) {
  __nv_bfloat162 h = *reinterpret_cast<__nv_bfloat162*>(&u);
  return __bfloat1622float2(h);
}
__device__ __forceinline__ uint32_t pack(float a, float b) {
  __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<uint32_t*>(&h);
}
// a peer block's slot, through a 32-bit shared::cluster address made inside the loop (not hoisted)
__device__ __forceinline__ float2 ld_peer(const float2* p, int rank) {
  uint32_t a = (uint32_t)__cvta_generic_to_shared(p), ra;
  float2 v;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(ra) : "r"(a), "r"(rank));
  asm volatile("ld.shared::cluster.v2.f32 {%0,%1}, [%2];" : "=f"(v.x), "=f"(v.y) : "r"(ra) : "memory");
  return v;
}
// equal-count Chan merge: each side n values
__device__ __forceinline__ void merge(float& m, float& q, float mo, float qo, float half_n) {
  float d = mo - m;
  q = q + qo + d * d * half_n;
  m = (m + mo) * 0.5f;
}

// CL blocks a row, TH threads a block, E elements a thread in chunks of VEC; DEPTH rows loaded
// ahead (persistent grid; 0: a block per row). WBMODE: 0 w, b in registers for the whole launch;
// 1 loaded per row before the reductions; 2 loaded in pass 2 (normir's committed shape); 3 w and
// b packed into one buffer (w's two words then b's, one 16-byte load a 4-element chunk); 4 none.
template <int CL, int TH, int E, int VEC, int DEPTH, int WBMODE, int MINB>
__global__ void __launch_bounds__(TH, MINB)
lnf(const bf16* __restrict__ x, const bf16* __restrict__ w, const bf16* __restrict__ b, bf16* __restrict__ y,
    float* __restrict__ mean_out, float* __restrict__ rstd_out, int M, float eps) {
  constexpr int NC = E / VEC, WPC = VEC / 2, NW = TH / 32, NSUB = N / CL;
  constexpr bool WBREG = WBMODE == 0;
  static_assert(CL * TH * E == N, "layout");
  __shared__ float2 red[NW];
  __shared__ float2 slot[2];
  cg::cluster_group cl = cg::this_cluster();
  const int rank = blockIdx.x % CL, cid = blockIdx.x / CL, ncl = gridDim.x / CL;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int colbase = rank * NSUB;
  uint32_t wr[NC][WPC], br[NC][WPC];
  if (WBREG) {
#pragma unroll
    for (int k = 0; k < NC; ++k) {
      int c = colbase + (k * TH + tid) * VEC;
      Ld<WPC>::ca(wr[k], w + c);
      Ld<WPC>::ca(br[k], b + c);
    }
  }
  uint32_t buf[DEPTH + 1][NC][WPC];
  const long long stride = (long long)ncl * N;
  const bf16* xp = x + (long long)cid * N + colbase + tid * VEC;
#pragma unroll
  for (int d = 0; d < DEPTH; ++d) {
    if (cid + d * ncl < M) {
#pragma unroll
      for (int k = 0; k < NC; ++k) Ld<WPC>::na(buf[d][k], xp + d * stride + k * TH * VEC);
    }
  }
  int it = 0;
  for (int r = cid; r < M; r += ncl, ++it) {
    if (r + DEPTH * ncl < M) {
#pragma unroll
      for (int k = 0; k < NC; ++k) Ld<WPC>::na(buf[DEPTH][k], xp + DEPTH * stride + k * TH * VEC);
    }
    xp += stride;
    if (WBMODE == 1) {
#pragma unroll
      for (int k = 0; k < NC; ++k) {
        int c = colbase + (k * TH + tid) * VEC;
        Ld<WPC>::ca(wr[k], w + c);
        Ld<WPC>::ca(br[k], b + c);
      }
    }
    // thread statistics: each chunk's mean and M2 (two passes over its VEC values), merged by Chan
    float m = 0.f, q = 0.f;
#pragma unroll
    for (int k = 0; k < NC; ++k) {
      float f[VEC];
#pragma unroll
      for (int j = 0; j < WPC; ++j) {
        float2 t = unpack(buf[0][k][j]);
        f[2 * j] = t.x;
        f[2 * j + 1] = t.y;
      }
      float cs = 0.f;
#pragma unroll
      for (int j = 0; j < VEC; ++j) cs += f[j];
      float cm = cs * (1.f / VEC), cq = 0.f;
#pragma unroll
      for (int j = 0; j < VEC; ++j) cq = fmaf(f[j] - cm, f[j] - cm, cq);
      if (k == 0) {
        m = cm;
        q = cq;
      } else {
        float d = cm - m;
        m = fmaf(d, 1.f / (k + 1), m);
        q = fmaf(d * d, (float)VEC * k / (k + 1), q + cq);
      }
    }
    float hn = E * 0.5f;
#pragma unroll
    for (int off = 16; off >= 1; off >>= 1, hn *= 2.f)
      merge(m, q, __shfl_xor_sync(~0u, m, off), __shfl_xor_sync(~0u, q, off), hn);
    if (lane == 0) red[warp] = make_float2(m, q);
    __syncthreads();
    float2 p = red[lane % NW];
    m = p.x;
    q = p.y;
    hn = E * 16.f;
#pragma unroll
    for (int off = NW / 2; off >= 1; off >>= 1, hn *= 2.f)
      merge(m, q, __shfl_xor_sync(~0u, m, off), __shfl_xor_sync(~0u, q, off), hn);
    if (tid == 0) slot[it & 1] = make_float2(m, q);
    cl.sync();
    float2 ps[CL];
#pragma unroll
    for (int j = 0; j < CL; ++j) ps[j] = ld_peer(&slot[it & 1], j);
    hn = E * TH * 0.5f;
#pragma unroll
    for (int width = 1; width < CL; width *= 2, hn *= 2.f)
#pragma unroll
      for (int j = 0; j < CL; j += 2 * width) {
        float mm = ps[j].x, qq = ps[j].y;
        merge(mm, qq, ps[j + width].x, ps[j + width].y, hn);
        ps[j] = make_float2(mm, qq);
      }
    float mean = ps[0].x, rstd = rsqrtf(ps[0].y * (1.f / N) + eps);
    if (tid == 0 && rank == 0) {
      mean_out[r] = mean;
      rstd_out[r] = rstd;
    }
    bf16* yp = y + (long long)r * N + colbase + tid * VEC;
#pragma unroll
    for (int k = 0; k < NC; ++k) {
      uint32_t o[WPC], wbv[2 * WPC];
      if (WBMODE == 3) {  // one load of 2 x VEC x 2 bytes: w and b of the chunk, interleaved by words
        int c = colbase + (k * TH + tid) * VEC;
        Ld<2 * WPC <= 4 ? 2 * WPC : 4>::ca(wbv, w + 2 * c);
        if (2 * WPC > 4) Ld<4>::ca(wbv + 4, w + 2 * c + 8);
      }
#pragma unroll
      for (int j = 0; j < WPC; ++j) {
        uint32_t wu, bu;
        if (WBMODE == 3) {  // w and b interleaved: one word of w then one of b (wb = w's buffer, 2N)
          int c = colbase + (k * TH + tid) * VEC + 2 * j;
          (void)c;
          wu = wbv[2 * j];
          bu = wbv[2 * j + 1];
        } else if (WBMODE == 4) {
          wu = 0x3f803f80u;  // 1, 1
          bu = 0;
        } else if (WBMODE == 2) {
          int c = colbase + (k * TH + tid) * VEC + 2 * j;
          wu = *reinterpret_cast<const uint32_t*>(w + c);
          bu = *reinterpret_cast<const uint32_t*>(b + c);
        } else {  // opaque per row, so the casts are not hoisted out of the row loop
          asm volatile("mov.b32 %0, %1;" : "=r"(wu) : "r"(wr[k][j]));
          asm volatile("mov.b32 %0, %1;" : "=r"(bu) : "r"(br[k][j]));
        }
        uint32_t xu;  // opaque: pass 2 casts x again instead of keeping pass 1's fp32 values
        asm volatile("mov.b32 %0, %1;" : "=r"(xu) : "r"(buf[0][k][j]));
        float2 f = unpack(xu), wf = unpack(wu), bf = unpack(bu);
        o[j] = pack(fmaf((f.x - mean) * rstd, wf.x, bf.x), fmaf((f.y - mean) * rstd, wf.y, bf.y));
      }
      Ld<WPC>::st(yp + k * TH * VEC, o);
    }
#pragma unroll
    for (int d = 0; d < DEPTH; ++d)
#pragma unroll
      for (int k = 0; k < NC; ++k)
#pragma unroll
        for (int j = 0; j < WPC; ++j) buf[d][k][j] = buf[d + 1][k][j];
    if (DEPTH == 0) break;
  }
  cl.sync();  // no block leaves while a peer may read its slot
}

static void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    printf("%s: %s\n", what, cudaGetErrorString(e));
    exit(1);
  }
}

// 30 timed calls of f (CUDA events around each), sorted.
template <class F>
std::vector<float> times_ms(F f) {
  cudaEvent_t a, z;
  cudaEventCreate(&a);
  cudaEventCreate(&z);
  std::vector<float> ts;
  for (int rep = 0; rep < 30; ++rep) {
    cudaEventRecord(a);
    f();
    cudaEventRecord(z);
    cudaEventSynchronize(z);
    float ms;
    cudaEventElapsedTime(&ms, a, z);
    ts.push_back(ms);
  }
  std::sort(ts.begin(), ts.end());
  return ts;
}

struct Bufs {
  bf16 *x, *w, *b, *y;
  float *mean, *rstd;
  int M;
};

static float bf2f(bf16 v) { return __bfloat162float(v); }

template <int CL, int TH, int E, int VEC, int DEPTH, int WBMODE, int MINB>
void run(const char* name, Bufs& B, std::vector<bf16>& hx, std::vector<bf16>& hw, std::vector<bf16>& hb) {
  auto kern = lnf<CL, TH, E, VEC, DEPTH, WBMODE, MINB>;
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = CL;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  cfg.blockDim = dim3(TH);
  cfg.gridDim = dim3(CL);
  int ncl = B.M;
  if (DEPTH > 0) {
    int active = 0;
    ck(cudaOccupancyMaxActiveClusters(&active, kern, &cfg), "occupancy");
    ncl = std::min(active, B.M);
  }
  cfg.gridDim = dim3(ncl * CL);
  cudaFuncAttributes fa;
  cudaFuncGetAttributes(&fa, kern);
  ck(cudaMemset(B.y, 0xff, (size_t)B.M * N * 2), "poison");
  auto launch = [&]() { ck(cudaLaunchKernelEx(&cfg, kern, B.x, B.w, B.b, B.y, B.mean, B.rstd, B.M, 1e-5f), "launch"); };
  launch();
  ck(cudaDeviceSynchronize(), "sync");
  // check rows against float64
  std::vector<bf16> hy(N);
  double worst = 0;
  int rows[] = {0, 1, B.M / 2, B.M - 1};
  for (int r : rows) {
    ck(cudaMemcpy(hy.data(), B.y + (size_t)r * N, N * 2, cudaMemcpyDeviceToHost), "d2h");
    double s = 0, q = 0;
    for (int j = 0; j < N; ++j) s += bf2f(hx[(size_t)r * N + j]);
    double mu = s / N;
    for (int j = 0; j < N; ++j) {
      double d = bf2f(hx[(size_t)r * N + j]) - mu;
      q += d * d;
    }
    double rs = 1.0 / sqrt(q / N + 1e-5);
    for (int j = 0; j < N; ++j) {
      double ref = (bf2f(hx[(size_t)r * N + j]) - mu) * rs * bf2f(hw[j]) + bf2f(hb[j]);
      double e = fabs(bf2f(hy[j]) - ref) / (1 + fabs(ref));
      if (!(e <= worst)) worst = e;  // NaN propagates
    }
  }
  for (int i = 0; i < 5; ++i) launch();
  std::vector<float> ts = times_ms(launch);
  double bytes = 2.0 * B.M * N * 2;
  printf("%-34s M=%d regs=%3d spill=%zu clusters=%5d err=%.2e  median %.1f GB/s  best %.1f\n", name, B.M, fa.numRegs,
         fa.localSizeBytes, ncl, worst, bytes / (ts[ts.size() / 2] * 1e6), bytes / (ts[0] * 1e6));
}

int main(int argc, char** argv) {
  int M = argc > 1 ? atoi(argv[1]) : 2048;
  Bufs B;
  B.M = M;
  size_t n = (size_t)M * N;
  std::vector<bf16> hx(n), hw(N), hb(N);
  srand(1);
  for (size_t i = 0; i < n; ++i) hx[i] = __float2bfloat16((rand() / (float)RAND_MAX - 0.5f) * 4.f + (i / N % 7));
  for (int i = 0; i < N; ++i) {
    hw[i] = __float2bfloat16(rand() / (float)RAND_MAX * 2.f - 1.f);
    hb[i] = __float2bfloat16(rand() / (float)RAND_MAX - 0.5f);
  }
  ck(cudaMalloc(&B.x, n * 2), "x");
  ck(cudaMalloc(&B.y, n * 2), "y");
  ck(cudaMalloc(&B.w, N * 4), "w");
  ck(cudaMalloc(&B.b, N * 2), "b");
  ck(cudaMalloc(&B.mean, M * 4), "m");
  ck(cudaMalloc(&B.rstd, M * 4), "r");
  cudaMemcpy(B.x, hx.data(), n * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(B.w, hw.data(), N * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(B.b, hb.data(), N * 2, cudaMemcpyHostToDevice);
  {  // copy ceiling
    bf16* c;
    ck(cudaMalloc(&c, n * 2), "c");
    std::vector<float> ts = times_ms([&]() { cudaMemcpyAsync(c, B.x, n * 2, cudaMemcpyDeviceToDevice); });
    printf("copy M=%d median %.1f GB/s\n", M, 2.0 * n * 2 / (ts[15] * 1e6));
    cudaFree(c);
  }
  if (argc > 2) {
  run<4, 256, 64, 4, 0, 2, 4>("base 4x256x64 v4 wb-late", B, hx, hw, hb);
  run<4, 256, 64, 8, 0, 2, 4>("base 4x256x64 v8 wb-late", B, hx, hw, hb);
  run<4, 256, 64, 4, 0, 4, 4>("base 4x256x64 v4 no w b", B, hx, hw, hb);
  run<4, 256, 64, 8, 0, 4, 4>("base 4x256x64 v8 no w b", B, hx, hw, hb);
  run<8, 128, 64, 4, 0, 2, 8>("base 8x128x64 v4 wb-late", B, hx, hw, hb);
  run<4, 128, 128, 4, 0, 2, 4>("base 4x128x128 v4 wb-late m4", B, hx, hw, hb);
  std::vector<bf16> hp(2 * N);
  for (int i = 0; i < N; i += 2) {
    hp[2 * i] = hw[i]; hp[2 * i + 1] = hw[i + 1]; hp[2 * i + 2] = hb[i]; hp[2 * i + 3] = hb[i + 1];
  }
  cudaMemcpy(B.w, hp.data(), N * 4, cudaMemcpyHostToDevice);
  run<4, 256, 64, 4, 0, 3, 4>("base 4x256x64 v4 wb packed", B, hx, hw, hb);
  run<4, 256, 64, 8, 0, 3, 4>("base 4x256x64 v8 wb packed", B, hx, hw, hb);
  run<8, 128, 64, 4, 0, 3, 8>("base 8x128x64 v4 wb packed", B, hx, hw, hb);
  run<4, 256, 64, 4, 0, 3, 4>("base 4x256x64 v4 wb packed", B, hx, hw, hb);
  cudaMemcpy(B.w, hw.data(), N * 2, cudaMemcpyHostToDevice);
  run<4, 256, 64, 4, 0, 2, 4>("base 4x256x64 v4 wb-late", B, hx, hw, hb);
  return 0;
  }
  // the persistent layouts (call 1)
  run<4, 256, 64, 4, 0, 2, 4>("base 4x256x64 v4 wb-late", B, hx, hw, hb);
  run<4, 256, 64, 4, 0, 1, 4>("base 4x256x64 v4 wb-early", B, hx, hw, hb);
  run<4, 1024, 16, 8, 1, 0, 1>("P 4x1024x16 v8 d1 wbreg", B, hx, hw, hb);
  run<4, 1024, 16, 8, 2, 0, 1>("P 4x1024x16 v8 d2 wbreg", B, hx, hw, hb);
  run<4, 1024, 16, 8, 3, 0, 1>("P 4x1024x16 v8 d3 wbreg", B, hx, hw, hb);
  run<4, 1024, 16, 4, 1, 0, 1>("P 4x1024x16 v4 d1 wbreg", B, hx, hw, hb);
  run<4, 1024, 16, 4, 2, 0, 1>("P 4x1024x16 v4 d2 wbreg", B, hx, hw, hb);
  run<4, 1024, 16, 8, 1, 1, 1>("P 4x1024x16 v8 d1 wbL1early", B, hx, hw, hb);
  run<4, 1024, 16, 8, 2, 1, 1>("P 4x1024x16 v8 d2 wbL1early", B, hx, hw, hb);
  run<4, 1024, 16, 8, 2, 2, 1>("P 4x1024x16 v8 d2 wbL1late", B, hx, hw, hb);
  run<8, 512, 16, 8, 1, 0, 2>("P 8x512x16 v8 d1 wbreg", B, hx, hw, hb);
  run<8, 512, 16, 8, 2, 0, 2>("P 8x512x16 v8 d2 wbreg", B, hx, hw, hb);
  run<8, 512, 16, 8, 2, 1, 2>("P 8x512x16 v8 d2 wbL1early", B, hx, hw, hb);
  run<4, 512, 32, 8, 1, 0, 1>("P 4x512x32 v8 d1 wbreg", B, hx, hw, hb);
  run<4, 512, 32, 8, 2, 0, 1>("P 4x512x32 v8 d2 wbreg", B, hx, hw, hb);
  run<8, 256, 32, 8, 1, 0, 2>("P 8x256x32 v8 d1 wbreg", B, hx, hw, hb);
  run<8, 256, 32, 8, 2, 1, 2>("P 8x256x32 v8 d2 wbL1early", B, hx, hw, hb);
  return 0;
}
