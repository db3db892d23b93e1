/* A stand-in NVTX injection library: what a profiler does at a program's first NVTX call,
 * printing each range instead of recording it. Checks the `nvtx` feature's side of NVTX3's
 * protocol (crates/purlin-collectives/src/nvtx.rs) on any machine, profiler or not:
 *
 *   cc -shared -fPIC -o probe_injection.so probe_injection.c
 *   NVTX_INJECTION64_PATH=$PWD/probe_injection.so ./quickstart   # built with --features nvtx
 *
 * Layouts and ids: NVTX3's nvtxDetail/nvtxTypes.h (CORE2 module 5; DomainRangePushEx 4,
 * DomainRangePop 5, DomainCreateA 12) and nvToolsExt.h (nvtxEventAttributes_t v2). */
#include <stdint.h>
#include <stdio.h>

typedef const void *(*get_export_table_t)(uint32_t id);
typedef int (*get_module_function_table_t)(int module, void ***table, unsigned *size);
typedef struct {
    size_t size;
    get_module_function_table_t get_module_function_table;
} callbacks_t;
typedef struct {
    uint16_t version, size;
    uint32_t category;
    int32_t color_type;
    uint32_t color;
    int32_t payload_type, reserved0;
    uint64_t payload;
    int32_t message_type;
    const char *message;
} attributes_t;

static char domain_name[64];

static void *domain_create(const char *name) {
    snprintf(domain_name, sizeof domain_name, "%s", name);
    fprintf(stderr, "NVTX-PROBE domain %s\n", name);
    return domain_name;
}

static int range_push(void *domain, const attributes_t *a) {
    fprintf(stderr, "NVTX-PROBE push %s/%s payload %llu (type %d, attributes v%u %u bytes)\n",
            domain ? (const char *)domain : "(default)", a->message_type == 1 ? a->message : "?",
            (unsigned long long)a->payload, a->payload_type, a->version, a->size);
    return 0;
}

static int range_pop(void *domain) {
    fprintf(stderr, "NVTX-PROBE pop %s\n", domain ? (const char *)domain : "(default)");
    return 0;
}

int InitializeInjectionNvtx2(get_export_table_t get_export_table) {
    const callbacks_t *callbacks = get_export_table(1);
    void **table = 0;
    unsigned size = 0;
    if (!callbacks || !callbacks->get_module_function_table(5, &table, &size) || size < 13) {
        return 0;
    }
    *(void **)table[12] = (void *)domain_create;
    *(void **)table[4] = (void *)range_push;
    *(void **)table[5] = (void *)range_pop;
    fprintf(stderr, "NVTX-PROBE injected: CORE2 table of %u slots\n", size);
    return 1;
}
