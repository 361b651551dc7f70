/* STAND-IN (sparkinfra test bed): not NCCL. A libnccl.so.2 that only reports the version it was
   built with through ncclGetVersion, so the NCCL pin can be placed and verified without a GPU.
   STANDIN_BUILD_TAG names one build among others of the same version (other bytes, other build-id),
   as two packagings of one NCCL release differ. */
#ifndef STANDIN_NCCL_VERSION
#define STANDIN_NCCL_VERSION "unknown"
#endif
#ifndef STANDIN_BUILD_TAG
#define STANDIN_BUILD_TAG ""
#endif

const char sparkbed_standin[] = "sparkinfra test bed stand-in for libnccl.so.2 " STANDIN_NCCL_VERSION;
const char sparkbed_standin_build[] = "build:" STANDIN_BUILD_TAG;

int ncclGetVersion(int *version)
{
    *version = STANDIN_NCCL_VERSION_CODE;
    return 0; /* ncclSuccess */
}
