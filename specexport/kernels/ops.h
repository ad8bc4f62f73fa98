/* What gqa.c and matmul.c share: onnxruntime's API (gqa.c's RegisterCustomOps sets it), TRY, a tensor's dims,
 * a kept buffer, the AMX tile configuration. */
#pragma once
#include <stdlib.h>

#include "onnxruntime_c_api.h"

#define API_VERSION 17 /* KernelContext_ParallelFor (onnxruntime 1.17) is the newest entry used */

extern const OrtApi *specexport_ort;
#define ort specexport_ort

#define TRY(x)                    \
  do {                            \
    OrtStatus *st_ = (x);         \
    if (st_) return st_;          \
  } while (0)

/* every op here runs on the CPU provider, its inputs and outputs in its default memory */
static inline const char *provider(const OrtCustomOp *op) { (void)op; return "CPUExecutionProvider"; }
static inline OrtMemType mem_type(const OrtCustomOp *op, size_t i) { (void)op; (void)i; return OrtMemTypeDefault; }

/* v's rank, and its dims into out when the rank is at most max (out's length) */
static inline OrtStatus *dims(const OrtValue *v, int64_t *out, size_t *rank, size_t max) {
  OrtTensorTypeAndShapeInfo *info;
  TRY(ort->GetTensorTypeAndShape(v, &info));
  OrtStatus *st = ort->GetDimensionsCount(info, rank);
  if (!st && *rank <= max) st = ort->GetDimensions(info, out, *rank);
  ort->ReleaseTensorTypeAndShapeInfo(info);
  return st;
}

/* LDTILECFG's 64-byte operand (AMX: matmul.c's part_amx, gqa_amx.h's attend_amx) */
typedef struct {
  uint8_t palette, start;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} __attribute__((packed)) TileConfig;

/* *buf grown to at least `bytes` (64-byte aligned, whole pages) and kept for the next call: a fresh block per
 * call was a fresh mapping of up to a few MB, page faults and all. NULL (and *cap 0) when memory runs out. */
static inline void *kept(void **buf, size_t *cap, size_t bytes) {
  if (bytes > *cap) {
    free(*buf);
    *cap = (bytes + 4095) & ~(size_t)4095;
    if (!(*buf = aligned_alloc(64, *cap))) *cap = 0;
  }
  return *buf;
}
