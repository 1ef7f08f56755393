/* A stand-in for libnvidia-ml.so.1 (the functions hetrain topo calls, nvml.h's C signatures):
 * two GPUs, 17:00.0 and 18:00.0, joined by NVLink links 0 and 1 of GPU 0 (GPU 1's are down),
 * under several PCIe switches. It lets load_gpu_topology run its dlopen path without a GPU. */
#include <stdio.h>
#include <string.h>

typedef struct {
  char bus_id_legacy[16];
  unsigned int domain, bus, device, pci_device_id, pci_sub_system_id;
  char bus_id[32];
} PciInfo;

static int gpus[2];
static const char* bus(const void* d) {
  return d == &gpus[0] ? "00000000:17:00.0" : "00000000:18:00.0";
}

int nvmlInit_v2(void) { return 0; }
int nvmlShutdown(void) { return 0; }
int nvmlDeviceGetCount_v2(unsigned int* n) {
  *n = 2;
  return 0;
}
int nvmlDeviceGetHandleByIndex_v2(unsigned int i, void** d) {
  if (i > 1) return 2;
  *d = &gpus[i];
  return 0;
}
int nvmlDeviceGetName(void* d, char* name, unsigned int len) {
  snprintf(name, len, "Fake GPU %d", d == &gpus[0] ? 0 : 1);
  return 0;
}
int nvmlDeviceGetPciInfo_v3(void* d, PciInfo* p) {
  memset(p, 0, sizeof *p);
  snprintf(p->bus_id, sizeof p->bus_id, "%s", bus(d));
  return 0;
}
int nvmlDeviceGetNvLinkState(void* d, unsigned int link, int* up) {
  *up = d == &gpus[0] && link < 2;
  return 0;
}
int nvmlDeviceGetNvLinkRemotePciInfo_v2(void* d, unsigned int link, PciInfo* p) {
  (void)link;
  memset(p, 0, sizeof *p);
  snprintf(p->bus_id, sizeof p->bus_id, "%s", bus(d == &gpus[0] ? &gpus[1] : &gpus[0]));
  return 0;
}
int nvmlDeviceGetTopologyCommonAncestor(void* a, void* b, int* level) {
  (void)a;
  (void)b;
  *level = 20;
  return 0;
}
int nvmlSystemGetDriverVersion(char* v, unsigned int len) {
  snprintf(v, len, "999.99");
  return 0;
}
