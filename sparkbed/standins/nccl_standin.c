/* STAND-IN (sparkinfra test bed): not NCCL. A libnccl.so.2 that only reports the version it was
   built with through ncclGetVersion, so the NCCL pin can be placed and verified without a GPU. */
const char sparkbed_standin[] = "sparkinfra test bed stand-in for libnccl.so.2";

int ncclGetVersion(int *version)
{
    *version = STANDIN_NCCL_VERSION_CODE;
    return 0; /* ncclSuccess */
}
