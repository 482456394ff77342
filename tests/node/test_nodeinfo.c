#include "base/err.h"
#include "node/nodeinfo.h"
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

static const struct nodeinfo_iface *find_iface(const struct node_info *ni, const char *name)
{
    for (int i = 0; i < ni->n_ifaces; i++)
        if (!strcmp(ni->ifaces[i].name, name))
            return &ni->ifaces[i];
    return NULL;
}

static void test_gather(void)
{
    struct node_info ni;
    char err[256] = "";
    int rc = nodeinfo_gather(&ni, "/tmp", err, sizeof err);
    CHECK_EQ_INT(rc, 0);
    CHECK(ni.mem_total > 0, "mem_total %lld", (long long)ni.mem_total);
    CHECK(ni.mem_available > 0 && ni.mem_available <= ni.mem_total, "available %lld total %lld",
          (long long)ni.mem_available, (long long)ni.mem_total);
    CHECK(ni.cores >= 1, "cores %d", ni.cores);
    CHECK(ni.cpu_model[0] != 0, "cpu model empty");
    CHECK(ni.cpu_model[0] != ' ', "cpu model not trimmed: '%s'", ni.cpu_model);
    CHECK(!strncmp(ni.os, "Linux ", 6) && strchr(ni.os + 6, ' '), "os '%s'", ni.os);
    CHECK(ni.hostname[0] != 0, "hostname empty");
    CHECK(ni.disk_total > 0 && ni.disk_free >= 0 && ni.disk_free <= ni.disk_total, "disk free %lld total %lld",
          (long long)ni.disk_free, (long long)ni.disk_total);
    const struct nodeinfo_iface *lo = find_iface(&ni, "lo");
    CHECK(lo != NULL, "no lo among %d interfaces", ni.n_ifaces);
    if (lo) {
        CHECK(lo->loopback, "lo not marked loopback");
        bool has127 = false;
        for (int i = 0; i < lo->n_addrs; i++)
            has127 = has127 || !strcmp(lo->addrs[i], "127.0.0.1");
        CHECK(has127, "lo has %d addresses, none 127.0.0.1", lo->n_addrs);
    }
    for (int i = 0; i < ni.n_ifaces; i++) {
        CHECK(ni.ifaces[i].n_addrs >= 1, "interface %s listed without an address", ni.ifaces[i].name);
        if (strcmp(ni.ifaces[i].name, "lo"))
            CHECK(!ni.ifaces[i].loopback || !strncmp(ni.ifaces[i].name, "lo", 2), "%s marked loopback",
                  ni.ifaces[i].name);
    }

    /* A models folder that does not exist yet is measured on its nearest parent. */
    struct node_info n2;
    CHECK_EQ_INT(nodeinfo_gather(&n2, "/tmp/cairn-no-such-dir/models/x/", err, sizeof err), 0);
    CHECK(n2.disk_total == ni.disk_total, "missing dir total %lld vs /tmp %lld", (long long)n2.disk_total,
          (long long)ni.disk_total);
    CHECK_EQ_INT(nodeinfo_gather(&n2, "relative-missing-dir/models", err, sizeof err), 0);
    CHECK(n2.disk_total > 0, "relative missing dir total %lld", (long long)n2.disk_total);
    CHECK_EQ_INT(nodeinfo_gather(&n2, NULL, err, sizeof err), 0);
    CHECK(n2.disk_free == 0 && n2.disk_total == 0, "NULL dir gives %lld/%lld", (long long)n2.disk_free,
          (long long)n2.disk_total);
    CHECK_EQ_INT(nodeinfo_gather(NULL, NULL, err, sizeof err), CAIRN_EINVAL);

    /* Two gathers a moment apart are the same machine: not a change. */
    CHECK_EQ_INT(nodeinfo_gather(&n2, "/tmp", err, sizeof err), 0);
    CHECK(!nodeinfo_changed(&ni, &n2), "two gathers reported as a change (avail %lld vs %lld)",
          (long long)ni.mem_available, (long long)n2.mem_available);
}

static void test_json(void)
{
    struct node_info ni, back;
    char err[256] = "";
    CHECK_EQ_INT(nodeinfo_gather(&ni, "/tmp", err, sizeof err), 0);
    json_t *j = nodeinfo_to_json(&ni);
    CHECK(j != NULL, "to_json NULL");
    /* Through text, as it travels between nodes. */
    char *text = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    json_error_t je;
    json_t *j2 = json_loads(text, 0, &je);
    CHECK(j2 != NULL, "reparse: %s", je.text);
    int rc = nodeinfo_from_json(j2, &back, err, sizeof err);
    CHECK(rc == 0, "from_json: %s", err);
    CHECK(!memcmp(&ni, &back, sizeof ni) || !nodeinfo_changed(&ni, &back), "round trip differs: %s", text);
    CHECK(back.mem_total == ni.mem_total && back.mem_available == ni.mem_available, "memory differs");
    CHECK(!strcmp(back.cpu_model, ni.cpu_model) && back.cores == ni.cores, "cpu differs");
    CHECK(back.n_ifaces == ni.n_ifaces, "ifaces %d vs %d", back.n_ifaces, ni.n_ifaces);
    for (int i = 0; i < ni.n_ifaces && i < back.n_ifaces; i++) {
        CHECK(!strcmp(ni.ifaces[i].name, back.ifaces[i].name) && ni.ifaces[i].loopback == back.ifaces[i].loopback &&
                  ni.ifaces[i].n_addrs == back.ifaces[i].n_addrs,
              "iface %d: %s vs %s", i, ni.ifaces[i].name, back.ifaces[i].name);
        for (int k = 0; k < ni.ifaces[i].n_addrs && k < back.ifaces[i].n_addrs; k++)
            CHECK(!strcmp(ni.ifaces[i].addrs[k], back.ifaces[i].addrs[k]), "addr %s vs %s", ni.ifaces[i].addrs[k],
                  back.ifaces[i].addrs[k]);
    }
    free(text);
    json_decref(j2);
    /* The bandwidth travels once measured, and its coming is a change worth a report. */
    CHECK(back.mem_bandwidth == 0 && !json_object_get(j = nodeinfo_to_json(&ni), "memory_bandwidth_bytes_per_s"),
          "no bandwidth before it is measured");
    json_decref(j);
    struct node_info measured = ni;
    measured.mem_bandwidth = 21000000000;
    CHECK(nodeinfo_changed(&ni, &measured), "the bandwidth's arrival is no change");
    j = nodeinfo_to_json(&measured);
    rc = nodeinfo_from_json(j, &back, err, sizeof err);
    CHECK(rc == 0 && back.mem_bandwidth == measured.mem_bandwidth, "bandwidth round trip: %s %lld", err,
          (long long)back.mem_bandwidth);
    json_decref(j);

    /* Every way a peer could send a bad object is refused with a message naming the field. */
    struct {
        const char *key;
        json_t *value; /* replaces key; NULL deletes it */
        const char *want;
    } bad[] = {
        {"memory_total_bytes", NULL, "memory_total_bytes"},
        {"memory_total_bytes", json_string("12"), "memory_total_bytes"},
        {"memory_available_bytes", json_integer(-1), "memory_available_bytes"},
        {"disk_free_bytes", json_integer(NODEINFO_BYTES_MAX + 1), "disk_free_bytes"},
        {"disk_total_bytes", NULL, "disk_total_bytes"},
        {"cpu_cores", json_integer(-1), "cpu_cores"},
        {"cpu_cores", json_real(2.5), "cpu_cores"},
        {"memory_bandwidth_bytes_per_s", json_integer(-5), "memory_bandwidth_bytes_per_s"},
        {"memory_bandwidth_bytes_per_s", json_string("fast"), "memory_bandwidth_bytes_per_s"},
        {"isa", json_string("avx2\nfma"), "isa"},
        {"cpu_model", json_integer(3), "cpu_model"},
        {"hostname", json_string("xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
                                 "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"),
         "hostname"},
        {"os", json_stringn("Li\0nux", 6), "os"},
        {"interfaces", json_object(), "interfaces"},
        {"interfaces", json_pack("[{s:s,s:b,s:[s]}]", "name", "eth0", "loopback", 0, "addresses", "300.1.1.1"),
         "eth0"},
        {"interfaces", json_pack("[{s:s,s:b,s:[s]}]", "name", "eth0", "loopback", 0, "addresses", "host.example"),
         "eth0"},
        {"interfaces", json_pack("[{s:s,s:i,s:[]}]", "name", "eth0", "loopback", 1, "addresses"), "loopback"},
        {"interfaces", json_pack("[{s:s,s:b,s:[]}]", "name", "", "loopback", 0, "addresses"), "empty name"},
        {"interfaces", json_pack("[{s:s,s:b}]", "name", "eth0", "loopback", 0), "addresses"},
        {"interfaces", json_pack("[i]", 3), "interface 0"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        json_t *o = nodeinfo_to_json(&ni);
        if (bad[i].value)
            json_object_set_new(o, bad[i].key, bad[i].value);
        else
            json_object_del(o, bad[i].key);
        memset(&back, 0x55, sizeof back);
        err[0] = 0;
        rc = nodeinfo_from_json(o, &back, err, sizeof err);
        CHECK(rc < 0, "bad case %zu (%s) accepted", i, bad[i].key);
        CHECK(strstr(err, bad[i].want) != NULL, "bad case %zu: message '%s' lacks '%s'", i, err, bad[i].want);
        CHECK(back.n_ifaces == 0 && back.mem_total == 0, "bad case %zu left out half-filled", i);
        json_decref(o);
    }
    /* Too many interfaces, too many addresses. */
    json_t *many = json_array();
    for (int i = 0; i <= NODEINFO_MAX_IFACES; i++) {
        char name[16];
        snprintf(name, sizeof name, "eth%d", i);
        json_array_append_new(many, json_pack("{s:s,s:b,s:[]}", "name", name, "loopback", 0, "addresses"));
    }
    json_t *o = nodeinfo_to_json(&ni);
    json_object_set_new(o, "interfaces", many);
    CHECK(nodeinfo_from_json(o, &back, err, sizeof err) == CAIRN_ERANGE, "too many interfaces: %s", err);
    json_t *addrs = json_array();
    for (int i = 0; i <= NODEINFO_MAX_ADDRS; i++)
        json_array_append_new(addrs, json_string("10.0.0.1"));
    json_object_set_new(o, "interfaces",
                        json_pack("[{s:s,s:b,s:o}]", "name", "eth0", "loopback", 0, "addresses", addrs));
    CHECK(nodeinfo_from_json(o, &back, err, sizeof err) == CAIRN_ERANGE, "too many addresses: %s", err);
    json_decref(o);
    CHECK(nodeinfo_from_json(NULL, &back, err, sizeof err) == CAIRN_EFORMAT, "NULL json accepted");
    json_t *arr = json_array();
    CHECK(nodeinfo_from_json(arr, &back, err, sizeof err) == CAIRN_EFORMAT, "array accepted");
    json_decref(arr);
}

static void test_changed(void)
{
    struct node_info a;
    memset(&a, 0, sizeof a);
    a.mem_total = (int64_t)16 << 30;
    a.mem_available = (int64_t)8 << 30;
    a.disk_total = (int64_t)500 << 30;
    a.disk_free = (int64_t)100 << 30;
    a.cores = 8;
    strcpy(a.cpu_model, "Test CPU");
    strcpy(a.os, "Linux");
    a.n_ifaces = 2;
    strcpy(a.ifaces[0].name, "eth0");
    a.ifaces[0].n_addrs = 2;
    strcpy(a.ifaces[0].addrs[0], "192.168.1.5");
    strcpy(a.ifaces[0].addrs[1], "fe80::1");
    strcpy(a.ifaces[1].name, "lo");
    a.ifaces[1].loopback = true;
    a.ifaces[1].n_addrs = 1;
    strcpy(a.ifaces[1].addrs[0], "127.0.0.1");

    struct node_info b = a;
    CHECK(!nodeinfo_changed(&a, &b), "identical infos changed");
    /* 2% of 16 GiB is ~328 MiB: 200 MiB less available is noise, 400 MiB is news. */
    b.mem_available -= (int64_t)200 << 20;
    CHECK(!nodeinfo_changed(&a, &b), "200 MiB of 16 GiB counted as a change");
    b.mem_available = a.mem_available - ((int64_t)400 << 20);
    CHECK(nodeinfo_changed(&a, &b), "400 MiB of 16 GiB not a change");
    /* On a small machine the 64 MiB floor applies: 2% of 1 GiB is 20 MiB. */
    struct node_info s = a, t;
    s.mem_total = (int64_t)1 << 30;
    s.mem_available = (int64_t)512 << 20;
    t = s;
    t.mem_available += (int64_t)40 << 20;
    CHECK(!nodeinfo_changed(&s, &t), "40 MiB on 1 GiB counted as a change");
    t.mem_available = s.mem_available + ((int64_t)70 << 20);
    CHECK(nodeinfo_changed(&s, &t), "70 MiB on 1 GiB not a change");
    t = s;
    t.mem_available = 0;
    CHECK(nodeinfo_changed(&s, &t), "known -> unknown memory not a change");

    b = a;
    b.disk_free -= (int64_t)1 << 30; /* 2% of 500 GiB is 10 GiB */
    CHECK(!nodeinfo_changed(&a, &b), "1 GiB of a 500 GiB disk counted as a change");
    b.disk_free = a.disk_free - ((int64_t)20 << 30);
    CHECK(nodeinfo_changed(&a, &b), "20 GiB of 500 GiB not a change");

    b = a;
    b.cores = 4;
    CHECK(nodeinfo_changed(&a, &b), "core count change missed");
    b = a;
    strcpy(b.hostname, "renamed");
    CHECK(nodeinfo_changed(&a, &b), "hostname change missed");
    /* Interfaces compare as sets: order does not matter, an address does. */
    b = a;
    b.ifaces[0] = a.ifaces[1];
    b.ifaces[1] = a.ifaces[0];
    strcpy(b.ifaces[1].addrs[0], "fe80::1");
    strcpy(b.ifaces[1].addrs[1], "192.168.1.5");
    CHECK(!nodeinfo_changed(&a, &b), "reordered interfaces counted as a change");
    strcpy(b.ifaces[1].addrs[0], "192.168.1.6");
    CHECK(nodeinfo_changed(&a, &b), "new address missed");
    b = a;
    b.n_ifaces = 1;
    CHECK(nodeinfo_changed(&a, &b) && nodeinfo_changed(&b, &a), "interface gone missed");
    b = a;
    b.ifaces[0].loopback = true;
    CHECK(nodeinfo_changed(&a, &b), "loopback flag change missed");
}

int main(int argc, char **argv)
{
    test_begin(argc, argv);
    RUN(test_gather);
    RUN(test_json);
    RUN(test_changed);
    return test_main_end();
}
