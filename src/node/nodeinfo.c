#include "node/nodeinfo.h"

#include "base/cpu.h"
#include "base/err.h"
#include "base/mem.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <sys/utsname.h>
#include <unistd.h>

/* Copies src into dst (size n), trimmed of surrounding white space. */
static void copy_trim(char *dst, size_t n, const char *src)
{
    while (*src && isspace((unsigned char)*src))
        src++;
    size_t len = strlen(src);
    while (len && isspace((unsigned char)src[len - 1]))
        len--;
    if (len >= n)
        len = n - 1;
    memcpy(dst, src, len);
    dst[len] = 0;
}

static void cpu_model_from_proc(char *dst, size_t n)
{
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        char *colon = strchr(line, ':');
        if (colon && !strncmp(line, "model name", 10)) {
            copy_trim(dst, n, colon + 1);
            break;
        }
    }
    fclose(f);
}

static int64_t mul_cap(uint64_t a, uint64_t b)
{
    if (a && b > (uint64_t)NODEINFO_BYTES_MAX / a)
        return NODEINFO_BYTES_MAX;
    return (int64_t)(a * b);
}

/* statvfs of dir, or of its nearest existing parent when it does not exist yet. */
static void disk_space(const char *dir, int64_t *free_out, int64_t *total_out)
{
    *free_out = *total_out = 0;
    char path[4096];
    if (!dir || !*dir || strlen(dir) >= sizeof path)
        return;
    strcpy(path, dir);
    for (;;) {
        struct statvfs st;
        if (statvfs(path, &st) == 0) {
            *free_out = mul_cap(st.f_bavail, st.f_frsize);
            *total_out = mul_cap(st.f_blocks, st.f_frsize);
            return;
        }
        if ((errno != ENOENT && errno != ENOTDIR) || !strcmp(path, "/") || !strcmp(path, "."))
            return;
        size_t len = strlen(path);
        while (len > 1 && path[len - 1] == '/') /* trailing slashes */
            path[--len] = 0;
        char *slash = strrchr(path, '/');
        if (!slash)
            strcpy(path, ".");
        else if (slash == path)
            strcpy(path, "/");
        else
            *slash = 0;
    }
}

static int cmp_iface(const void *a, const void *b)
{
    return strcmp(((const struct nodeinfo_iface *)a)->name, ((const struct nodeinfo_iface *)b)->name);
}

static int cmp_addr(const void *a, const void *b) { return strcmp(a, b); }

static struct nodeinfo_iface *iface_slot(struct node_info *ni, const char *name)
{
    for (int i = 0; i < ni->n_ifaces; i++)
        if (!strcmp(ni->ifaces[i].name, name))
            return &ni->ifaces[i];
    if (ni->n_ifaces == NODEINFO_MAX_IFACES || strlen(name) >= NODEINFO_NAME_MAX)
        return NULL;
    struct nodeinfo_iface *f = &ni->ifaces[ni->n_ifaces++];
    memset(f, 0, sizeof *f);
    strcpy(f->name, name);
    return f;
}

static void gather_ifaces(struct node_info *ni)
{
    struct ifaddrs *list;
    if (getifaddrs(&list) != 0)
        return;
    for (struct ifaddrs *a = list; a; a = a->ifa_next) {
        if (!a->ifa_addr || !a->ifa_name || !(a->ifa_flags & IFF_UP))
            continue;
        int fam = a->ifa_addr->sa_family;
        char ip[NODEINFO_IP_MAX];
        if (fam == AF_INET) {
            if (!inet_ntop(AF_INET, &((struct sockaddr_in *)(void *)a->ifa_addr)->sin_addr, ip, sizeof ip))
                continue;
        } else if (fam == AF_INET6) {
            if (!inet_ntop(AF_INET6, &((struct sockaddr_in6 *)(void *)a->ifa_addr)->sin6_addr, ip, sizeof ip))
                continue;
        } else {
            continue;
        }
        struct nodeinfo_iface *f = iface_slot(ni, a->ifa_name);
        if (!f)
            continue;
        f->loopback = f->loopback || (a->ifa_flags & IFF_LOOPBACK);
        bool dup = false;
        for (int i = 0; i < f->n_addrs; i++)
            dup = dup || !strcmp(f->addrs[i], ip);
        if (!dup && f->n_addrs < NODEINFO_MAX_ADDRS)
            strcpy(f->addrs[f->n_addrs++], ip);
    }
    freeifaddrs(list);
    qsort(ni->ifaces, (size_t)ni->n_ifaces, sizeof ni->ifaces[0], cmp_iface);
    for (int i = 0; i < ni->n_ifaces; i++)
        qsort(ni->ifaces[i].addrs, (size_t)ni->ifaces[i].n_addrs, NODEINFO_IP_MAX, cmp_addr);
}

int nodeinfo_gather(struct node_info *out, const char *models_dir, char *err, size_t errlen)
{
    if (!out)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "nodeinfo_gather: out is NULL");
    memset(out, 0, sizeof *out);
    int64_t total = mem_total(), avail = mem_available();
    out->mem_total = total > 0 ? total : 0;
    out->mem_available = avail > 0 && avail <= out->mem_total ? avail : 0;

    const struct cpu_features *cf = cpu_features();
    copy_trim(out->cpu_model, sizeof out->cpu_model, cf->model);
    if (!out->cpu_model[0])
        cpu_model_from_proc(out->cpu_model, sizeof out->cpu_model);
    cpu_features_string(cf, out->isa, (int)sizeof out->isa);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    out->cores = n > 0 && n <= 65536 ? (int)n : 1;

    struct utsname u;
    if (uname(&u) == 0) {
        char os[3 * sizeof u.sysname];
        snprintf(os, sizeof os, "%.64s %.64s %.64s", u.sysname, u.release, u.machine);
        copy_trim(out->os, sizeof out->os, os);
    }
    char host[256];
    if (gethostname(host, sizeof host) == 0) {
        host[sizeof host - 1] = 0;
        copy_trim(out->hostname, sizeof out->hostname, host);
    }
    disk_space(models_dir, &out->disk_free, &out->disk_total);
    gather_ifaces(out);
    return 0;
}

json_t *nodeinfo_to_json(const struct node_info *ni)
{
    json_t *ifs = json_array();
    if (!ifs)
        return NULL;
    for (int i = 0; i < ni->n_ifaces; i++) {
        const struct nodeinfo_iface *f = &ni->ifaces[i];
        json_t *addrs = json_array();
        for (int k = 0; addrs && k < f->n_addrs; k++)
            if (json_array_append_new(addrs, json_string(f->addrs[k])) != 0) {
                json_decref(addrs);
                addrs = NULL;
            }
        json_t *o = addrs ? json_pack("{s:s, s:b, s:o}", "name", f->name, "loopback", f->loopback,
                                      "addresses", addrs)
                          : NULL;
        if (!o || json_array_append_new(ifs, o) != 0) {
            json_decref(ifs);
            return NULL;
        }
    }
    json_t *o = json_pack("{s:I, s:I, s:I, s:I, s:s, s:i, s:s, s:s, s:s, s:o}", "memory_total_bytes",
                          (json_int_t)ni->mem_total, "memory_available_bytes", (json_int_t)ni->mem_available,
                          "disk_free_bytes", (json_int_t)ni->disk_free, "disk_total_bytes",
                          (json_int_t)ni->disk_total, "cpu_model", ni->cpu_model, "cpu_cores", ni->cores, "isa",
                          ni->isa, "os", ni->os, "hostname", ni->hostname, "interfaces", ifs);
    if (o && ni->mem_bandwidth > 0 &&
        json_object_set_new(o, "memory_bandwidth_bytes_per_s", json_integer((json_int_t)ni->mem_bandwidth))) {
        json_decref(o);
        return NULL;
    }
    return o;
}

static int get_int(const json_t *j, const char *key, int64_t lo, int64_t hi, int64_t *v, char *err,
                   size_t errlen)
{
    json_t *x = json_object_get(j, key);
    if (!json_is_integer(x))
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "node info: \"%s\" missing or not an integer", key);
    json_int_t n = json_integer_value(x);
    if (n < lo || n > hi)
        return cairn_fail(err, errlen, CAIRN_ERANGE, "node info: \"%s\" = %lld out of [%lld, %lld]", key,
                          (long long)n, (long long)lo, (long long)hi);
    *v = n;
    return 0;
}

static int get_str(const json_t *j, const char *key, char *dst, size_t n, char *err, size_t errlen)
{
    json_t *x = json_object_get(j, key);
    if (!json_is_string(x))
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "node info: \"%s\" missing or not a string", key);
    size_t len = json_string_length(x);
    const char *s = json_string_value(x);
    if (len >= n)
        return cairn_fail(err, errlen, CAIRN_ERANGE, "node info: \"%s\" longer than %zu bytes", key, n - 1);
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f)
            return cairn_fail(err, errlen, CAIRN_EFORMAT, "node info: \"%s\" holds control byte 0x%02x", key,
                              (unsigned char)s[i]);
    memcpy(dst, s, len + 1);
    return 0;
}

static int parse_iface(const json_t *o, struct nodeinfo_iface *f, int idx, char *err, size_t errlen)
{
    if (!json_is_object(o))
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "node info: interface %d is not an object", idx);
    int rc = get_str(o, "name", f->name, sizeof f->name, err, errlen);
    if (rc)
        return rc;
    if (!f->name[0])
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "node info: interface %d has an empty name", idx);
    json_t *lb = json_object_get(o, "loopback");
    if (!json_is_boolean(lb))
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "node info: interface %s: \"loopback\" not a boolean",
                          f->name);
    f->loopback = json_is_true(lb);
    json_t *addrs = json_object_get(o, "addresses");
    if (!json_is_array(addrs))
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "node info: interface %s: \"addresses\" not an array",
                          f->name);
    if (json_array_size(addrs) > NODEINFO_MAX_ADDRS)
        return cairn_fail(err, errlen, CAIRN_ERANGE, "node info: interface %s has %zu addresses (max %d)",
                          f->name, json_array_size(addrs), NODEINFO_MAX_ADDRS);
    for (size_t k = 0; k < json_array_size(addrs); k++) {
        json_t *a = json_array_get(addrs, k);
        const char *s = json_string_value(a);
        unsigned char bin[16];
        if (!s || strlen(s) >= NODEINFO_IP_MAX ||
            (inet_pton(AF_INET, s, bin) != 1 && inet_pton(AF_INET6, s, bin) != 1))
            return cairn_fail(err, errlen, CAIRN_EFORMAT, "node info: interface %s: address %zu is not a numeric IP",
                              f->name, k);
        strcpy(f->addrs[f->n_addrs++], s);
    }
    return 0;
}

int nodeinfo_from_json(const json_t *j, struct node_info *out, char *err, size_t errlen)
{
    if (!out)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "nodeinfo_from_json: out is NULL");
    memset(out, 0, sizeof *out);
    if (!json_is_object(j))
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "node info is not a JSON object");
    int64_t cores = 0;
    int rc;
    if ((rc = get_int(j, "memory_total_bytes", 0, NODEINFO_BYTES_MAX, &out->mem_total, err, errlen)) ||
        (rc = get_int(j, "memory_available_bytes", 0, NODEINFO_BYTES_MAX, &out->mem_available, err, errlen)) ||
        (rc = get_int(j, "disk_free_bytes", 0, NODEINFO_BYTES_MAX, &out->disk_free, err, errlen)) ||
        (rc = get_int(j, "disk_total_bytes", 0, NODEINFO_BYTES_MAX, &out->disk_total, err, errlen)) ||
        (rc = get_int(j, "cpu_cores", 0, 65536, &cores, err, errlen)) ||
        (rc = get_str(j, "cpu_model", out->cpu_model, sizeof out->cpu_model, err, errlen)) ||
        (rc = get_str(j, "isa", out->isa, sizeof out->isa, err, errlen)) ||
        (rc = get_str(j, "os", out->os, sizeof out->os, err, errlen)) ||
        (rc = get_str(j, "hostname", out->hostname, sizeof out->hostname, err, errlen)) ||
        (json_object_get(j, "memory_bandwidth_bytes_per_s") && /* optional: 0 until measured */
         (rc = get_int(j, "memory_bandwidth_bytes_per_s", 0, NODEINFO_BYTES_MAX, &out->mem_bandwidth, err, errlen))))
        goto fail;
    out->cores = (int)cores;
    json_t *ifs = json_object_get(j, "interfaces");
    if (!json_is_array(ifs)) {
        rc = cairn_fail(err, errlen, CAIRN_EFORMAT, "node info: \"interfaces\" missing or not an array");
        goto fail;
    }
    if (json_array_size(ifs) > NODEINFO_MAX_IFACES) {
        rc = cairn_fail(err, errlen, CAIRN_ERANGE, "node info: %zu interfaces (max %d)", json_array_size(ifs),
                        NODEINFO_MAX_IFACES);
        goto fail;
    }
    for (size_t i = 0; i < json_array_size(ifs); i++) {
        struct nodeinfo_iface *f = &out->ifaces[out->n_ifaces++];
        if ((rc = parse_iface(json_array_get(ifs, i), f, (int)i, err, errlen)))
            goto fail;
    }
    return 0;
fail:
    memset(out, 0, sizeof *out);
    return rc;
}

/* A move of at least max(min_delta, 2% of base) is a change. */
static bool moved(int64_t x, int64_t y, int64_t min_delta, int64_t base)
{
    int64_t d = x > y ? x - y : y - x;
    int64_t rel = base > 0 ? base / 100 * NODEINFO_REL_DELTA_PCT : 0;
    return d >= (rel > min_delta ? rel : min_delta);
}

static bool addr_in(const struct nodeinfo_iface *f, const char *ip)
{
    for (int i = 0; i < f->n_addrs; i++)
        if (!strcmp(f->addrs[i], ip))
            return true;
    return false;
}

/* Every interface of a has a twin in b with the same flag and addresses. */
static bool ifaces_within(const struct node_info *a, const struct node_info *b)
{
    for (int i = 0; i < a->n_ifaces; i++) {
        const struct nodeinfo_iface *fa = &a->ifaces[i], *fb = NULL;
        for (int k = 0; k < b->n_ifaces && !fb; k++)
            if (!strcmp(b->ifaces[k].name, fa->name))
                fb = &b->ifaces[k];
        if (!fb || fb->loopback != fa->loopback || fb->n_addrs != fa->n_addrs)
            return false;
        for (int k = 0; k < fa->n_addrs; k++)
            if (!addr_in(fb, fa->addrs[k]))
                return false;
    }
    return true;
}

bool nodeinfo_changed(const struct node_info *a, const struct node_info *b)
{
    int64_t mem_base = a->mem_total > b->mem_total ? a->mem_total : b->mem_total;
    int64_t disk_base = a->disk_total > b->disk_total ? a->disk_total : b->disk_total;
    if (moved(a->mem_total, b->mem_total, NODEINFO_MEM_MIN_DELTA, mem_base) ||
        moved(a->mem_available, b->mem_available, NODEINFO_MEM_MIN_DELTA, mem_base) ||
        moved(a->disk_total, b->disk_total, NODEINFO_DISK_MIN_DELTA, disk_base) ||
        moved(a->disk_free, b->disk_free, NODEINFO_DISK_MIN_DELTA, disk_base))
        return true;
    if (a->cores != b->cores || a->mem_bandwidth != b->mem_bandwidth || strcmp(a->cpu_model, b->cpu_model) ||
        strcmp(a->isa, b->isa) ||
        strcmp(a->os, b->os) || strcmp(a->hostname, b->hostname))
        return true;
    return a->n_ifaces != b->n_ifaces || !ifaces_within(a, b) || !ifaces_within(b, a);
}
