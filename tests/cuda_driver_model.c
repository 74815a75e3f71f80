/* A model of the CUDA driver library (libcuda.so.1) for tests without a GPU: every entry point the backend's
 * CudaDevice reaches through cuda-bindings, each forwarding its arguments to one Python function
 * (uaii_driver_call, cffi's extern "Python"), which runs them on the host model of a device
 * (tests/cuda_driver_model.py says why and what it checks). Built with the soname libcuda.so.1, so that
 * cuda-bindings, which looks for an already loaded driver by that name first, binds to it.
 *
 * Arguments travel as 64-bit words in the C order of the driver's own prototype (the newest version of each, as
 * cuGetProcAddress hands them to cuda-bindings); an output parameter travels as its address. */
#include <stdint.h>
#include <stddef.h>
#include <string.h>

typedef int CUresult;
typedef unsigned long long W;

int uaii_driver_call(const char *name, unsigned long long *args, int n);  /* extern "Python+C", by cffi */

static CUresult call(const char *name, W *args, int n) { return (CUresult)uaii_driver_call(name, args, n); }
#define P(x) ((W)(uintptr_t)(x))
#define CALL(name, ...) do { W a_[] = {__VA_ARGS__}; return call(name, a_, (int)(sizeof a_ / sizeof a_[0])); } while (0)

CUresult cuInit(unsigned flags) { CALL("cuInit", flags); }
CUresult cuDriverGetVersion(int *v) { CALL("cuDriverGetVersion", P(v)); }
CUresult cuDeviceGetCount(int *n) { CALL("cuDeviceGetCount", P(n)); }
CUresult cuDeviceGet(int *dev, int ordinal) { CALL("cuDeviceGet", P(dev), (W)ordinal); }
CUresult cuDeviceGetName(char *name, int len, int dev) { CALL("cuDeviceGetName", P(name), (W)len, (W)dev); }
CUresult cuDeviceGetAttribute(int *pi, int attrib, int dev) { CALL("cuDeviceGetAttribute", P(pi), (W)attrib, (W)dev); }
CUresult cuDeviceTotalMem(size_t *bytes, int dev) { CALL("cuDeviceTotalMem", P(bytes), (W)dev); }
CUresult cuDevicePrimaryCtxRetain(void **ctx, int dev) { CALL("cuDevicePrimaryCtxRetain", P(ctx), (W)dev); }
CUresult cuDevicePrimaryCtxRelease(int dev) { CALL("cuDevicePrimaryCtxRelease", (W)dev); }
CUresult cuCtxSetCurrent(void *ctx) { CALL("cuCtxSetCurrent", P(ctx)); }
CUresult cuCtxSynchronize(void) { CALL("cuCtxSynchronize", 0); }
CUresult cuModuleLoadData(void **mod, const void *image) { CALL("cuModuleLoadData", P(mod), P(image)); }
CUresult cuModuleGetFunction(void **f, void *mod, const char *name) { CALL("cuModuleGetFunction", P(f), P(mod), P(name)); }
CUresult cuModuleUnload(void *mod) { CALL("cuModuleUnload", P(mod)); }
CUresult cuFuncSetAttribute(void *f, int attrib, int value) { CALL("cuFuncSetAttribute", P(f), (W)attrib, (W)(int64_t)value); }
CUresult cuMemAlloc(W *dptr, size_t n) { CALL("cuMemAlloc", P(dptr), (W)n); }
CUresult cuMemFree(W dptr) { CALL("cuMemFree", dptr); }
CUresult cuMemHostAlloc(void **pp, size_t n, unsigned flags) { CALL("cuMemHostAlloc", P(pp), (W)n, (W)flags); }
CUresult cuMemFreeHost(void *p) { CALL("cuMemFreeHost", P(p)); }
CUresult cuMemcpyHtoD(W dst, const void *src, size_t n) { CALL("cuMemcpyHtoD", dst, P(src), (W)n); }
CUresult cuMemcpyDtoH(void *dst, W src, size_t n) { CALL("cuMemcpyDtoH", P(dst), src, (W)n); }
CUresult cuMemcpyDtoD(W dst, W src, size_t n) { CALL("cuMemcpyDtoD", dst, src, (W)n); }
CUresult cuMemcpyHtoDAsync(W dst, const void *src, size_t n, void *s) { CALL("cuMemcpyHtoDAsync", dst, P(src), (W)n, P(s)); }
CUresult cuMemcpyDtoHAsync(void *dst, W src, size_t n, void *s) { CALL("cuMemcpyDtoHAsync", P(dst), src, (W)n, P(s)); }
CUresult cuMemcpyDtoDAsync(W dst, W src, size_t n, void *s) { CALL("cuMemcpyDtoDAsync", dst, src, (W)n, P(s)); }
CUresult cuStreamCreate(void **s, unsigned flags) { CALL("cuStreamCreate", P(s), (W)flags); }
CUresult cuStreamDestroy(void *s) { CALL("cuStreamDestroy", P(s)); }
CUresult cuStreamSynchronize(void *s) { CALL("cuStreamSynchronize", P(s)); }
CUresult cuStreamWaitEvent(void *s, void *e, unsigned flags) { CALL("cuStreamWaitEvent", P(s), P(e), (W)flags); }
CUresult cuStreamBeginCapture(void *s, int mode) { CALL("cuStreamBeginCapture", P(s), (W)mode); }
CUresult cuStreamEndCapture(void *s, void **graph) { CALL("cuStreamEndCapture", P(s), P(graph)); }
CUresult cuEventCreate(void **e, unsigned flags) { CALL("cuEventCreate", P(e), (W)flags); }
CUresult cuEventDestroy(void *e) { CALL("cuEventDestroy", P(e)); }
CUresult cuEventRecord(void *e, void *s) { CALL("cuEventRecord", P(e), P(s)); }
CUresult cuEventSynchronize(void *e) { CALL("cuEventSynchronize", P(e)); }
CUresult cuEventElapsedTime(float *ms, void *start, void *end) { CALL("cuEventElapsedTime", P(ms), P(start), P(end)); }
CUresult cuGraphInstantiate(void **exec, void *graph, unsigned long long flags) { CALL("cuGraphInstantiate", P(exec), P(graph), (W)flags); }
CUresult cuGraphDestroy(void *graph) { CALL("cuGraphDestroy", P(graph)); }
CUresult cuGraphExecDestroy(void *exec) { CALL("cuGraphExecDestroy", P(exec)); }
CUresult cuGraphLaunch(void *exec, void *s) { CALL("cuGraphLaunch", P(exec), P(s)); }
CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned shared, void *s, void **params, void **extra) {
    CALL("cuLaunchKernel", P(f), gx, gy, gz, bx, by, bz, shared, P(s), P(params), P(extra));
}

/* the names of the driver's status codes the model returns (cuGetErrorName answers without the model) */
static const struct { int code; const char *name; } ERRORS[] = {
    {0, "CUDA_SUCCESS"}, {1, "CUDA_ERROR_INVALID_VALUE"}, {2, "CUDA_ERROR_OUT_OF_MEMORY"},
    {3, "CUDA_ERROR_NOT_INITIALIZED"}, {100, "CUDA_ERROR_NO_DEVICE"}, {101, "CUDA_ERROR_INVALID_DEVICE"},
    {200, "CUDA_ERROR_INVALID_IMAGE"}, {201, "CUDA_ERROR_INVALID_CONTEXT"}, {209, "CUDA_ERROR_NO_BINARY_FOR_GPU"},
    {400, "CUDA_ERROR_INVALID_HANDLE"}, {500, "CUDA_ERROR_NOT_FOUND"}, {700, "CUDA_ERROR_ILLEGAL_ADDRESS"},
    {701, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"}, {900, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"},
    {901, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"}, {999, "CUDA_ERROR_UNKNOWN"},
};

CUresult cuGetErrorName(CUresult err, const char **out) {
    for (size_t i = 0; i < sizeof ERRORS / sizeof ERRORS[0]; i++)
        if (ERRORS[i].code == err) { *out = ERRORS[i].name; return 0; }
    *out = NULL;
    return 1;
}

CUresult cuGetErrorString(CUresult err, const char **out) { return cuGetErrorName(err, out); }

/* NVRTC opens libcuda.so.1 too when there is one, and asks it for private tables: the model has none, as a driver
 * that does not know the id asked for (NVRTC then does without them) */
CUresult cuGetExportTable(const void **table, const void *id) {
    (void)id;
    *table = NULL;
    return 500;
}

#define ENTRY(fn) {#fn, (void *)fn}
static const struct { const char *name; void *fn; } ENTRIES[] = {
    ENTRY(cuInit), ENTRY(cuDriverGetVersion), ENTRY(cuDeviceGetCount), ENTRY(cuDeviceGet), ENTRY(cuDeviceGetName),
    ENTRY(cuDeviceGetAttribute), ENTRY(cuDeviceTotalMem), ENTRY(cuDevicePrimaryCtxRetain),
    ENTRY(cuDevicePrimaryCtxRelease), ENTRY(cuCtxSetCurrent), ENTRY(cuCtxSynchronize), ENTRY(cuModuleLoadData),
    ENTRY(cuModuleGetFunction), ENTRY(cuModuleUnload), ENTRY(cuFuncSetAttribute), ENTRY(cuMemAlloc),
    ENTRY(cuMemFree), ENTRY(cuMemHostAlloc), ENTRY(cuMemFreeHost), ENTRY(cuMemcpyHtoD), ENTRY(cuMemcpyDtoH),
    ENTRY(cuMemcpyDtoD), ENTRY(cuMemcpyHtoDAsync), ENTRY(cuMemcpyDtoHAsync), ENTRY(cuMemcpyDtoDAsync),
    ENTRY(cuStreamCreate), ENTRY(cuStreamDestroy), ENTRY(cuStreamSynchronize), ENTRY(cuStreamWaitEvent),
    ENTRY(cuStreamBeginCapture), ENTRY(cuStreamEndCapture), ENTRY(cuEventCreate), ENTRY(cuEventDestroy),
    ENTRY(cuEventRecord), ENTRY(cuEventSynchronize), ENTRY(cuEventElapsedTime), ENTRY(cuGraphInstantiate),
    ENTRY(cuGraphDestroy), ENTRY(cuGraphExecDestroy), ENTRY(cuGraphLaunch), ENTRY(cuLaunchKernel),
    ENTRY(cuGetErrorName), ENTRY(cuGetErrorString),
    {"cuGraphInstantiateWithFlags", (void *)cuGraphInstantiate},  /* what cuGraphInstantiate is since CUDA 12 */
};

/* cuda-bindings asks for every entry point by its base name and the CUDA version it was built for; the model has
 * one version of each (the newest prototype) and reports the rest as not found, as a driver without them would:
 * calling one of those raises cuda-bindings' own "function not found" error. */
CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, unsigned long long flags, int *status) {
    for (size_t i = 0; i < sizeof ENTRIES / sizeof ENTRIES[0]; i++)
        if (strcmp(ENTRIES[i].name, symbol) == 0) {
            *pfn = ENTRIES[i].fn;
            if (status) *status = 0;
            return 0;
        }
    *pfn = NULL;
    if (status) *status = 1;  /* CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND */
    return 500;
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, unsigned long long flags) {
    return cuGetProcAddress_v2(symbol, pfn, version, flags, NULL);
}
