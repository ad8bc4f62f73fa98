/* Stand-in for onnxruntime's plugin execution-provider API, which onnxruntime_c_api.h includes at its end:
 * specexport's kernels use none of it, so the 157 KB upstream header is not vendored. */
