/* The worker inside one node in this process, with the real `cairn runner`: a placed
 * instance gets its runner started and reported Ready in the state; deleting the
 * instance stops the runner process and removes the runner from the state; a runner
 * killed is reported Failed even though it restarts before the next report; a runner that
 * always fails gets its instance deleted once the supervisor gives up. (A model that
 * cannot be found is refused by the master at placement; plan's FAIL is tested in
 * test_plan.) Every wait is bounded; skipped
 * with a message when the binary is missing. */
#include "node/worker.h"

#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/err.h"
#include "base/log.h"
#include "model/synth.h"
#include "testutil.h"

static char err[1024];
static char root[256];

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

struct look {
    const char *instance_id;
    char runner_id[IDS_ID_MAX + 1];
    enum cluster_runner_status status;
    char error[512];
    bool has_instance, has_runner, has_node;
    const char *node;
};

static void look_fn(void *ctx, const struct cluster_state *s)
{
    struct look *l = ctx;
    l->has_node = l->node && cluster_state_find_node(s, l->node);
    const struct cluster_instance *in = l->instance_id ? cluster_state_find_instance(s, l->instance_id) : NULL;
    l->has_instance = in != NULL;
    if (in && in->n_shards)
        snprintf(l->runner_id, sizeof l->runner_id, "%s", in->shards[0].runner_id);
    const struct cluster_runner *r = l->runner_id[0] ? cluster_state_find_runner(s, l->runner_id) : NULL;
    l->has_runner = r != NULL;
    if (r) {
        l->status = r->status;
        snprintf(l->error, sizeof l->error, "%s", r->error ? r->error : "");
    }
}

static int place(struct node *n, const char *model, char *instance_id)
{
    struct command c;
    struct command_result res;
    int rc = CAIRN_EIO;
    double t0 = clock_sec();
    while (clock_sec() - t0 < 20) { /* the master needs our node info first */
        command_init(&c, COMMAND_PLACE_INSTANCE);
        snprintf(c.place_instance.model_id, sizeof c.place_instance.model_id, "%s", model);
        c.place_instance.sharding = CLUSTER_SHARDING_PIPELINE;
        c.place_instance.min_nodes = 1;
        rc = node_command(n, &c, 5000, &res);
        command_clear(&c);
        if (!rc)
            break;
        sleep_ms(200);
    }
    CHECK(rc == 0, "PlaceInstance %s: %d %s", model, rc, res.message);
    snprintf(instance_id, IDS_ID_MAX + 1, "%s", rc ? "" : res.instance_id);
    return rc;
}

static void test_worker(const char *models, bool give_up)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/data%s", root, give_up ? "-give-up" : "");
    /* give_up: a runner command that always fails at once (the config is ignored). */
    const char *argv[] = {give_up ? "/bin/false" : CAIRN_BINARY, "runner", NULL};
    struct supervisor_config sc;
    supervisor_config_defaults(&sc);
    sc.argv = argv;
    sc.backoff_ms = give_up ? 20 : 100;
    sc.backoff_max_ms = 200;
    struct worker *w = NULL;
    int rc = worker_create(&w, &sc, err, sizeof err);
    CHECK(rc == 0, "worker_create: %s", err);
    if (rc)
        return;
    struct node_config cfg = {
        .data_dir = dir,
        .models_dir = models,
        .bind_addr = "127.0.0.1",
        .force_master = true,
        .worker = true,
        .memory_limit = (int64_t)1 << 32,
        .runners = worker_runners_json,
        .runners_ctx = w,
    };
    struct node *n = NULL;
    rc = node_create(&n, &cfg, err, sizeof err);
    CHECK(rc == 0, "node_create: %s", err);
    if (rc) {
        worker_release(w);
        return;
    }
    rc = node_start(n, err, sizeof err);
    CHECK(rc == 0, "node_start: %s", err);
    rc = worker_start(w, n, err, sizeof err);
    CHECK(rc == 0, "worker_start: %s", err);

    char inst[IDS_ID_MAX + 1] = "";
    if (give_up) {
        if (!place(n, "tiny", inst)) {
            /* Failed max_failures times: the worker deletes the instance, the runner goes. */
            struct look l = {.instance_id = inst};
            bool seen_failed = false, gone = false;
            double t0 = clock_sec();
            while (clock_sec() - t0 < 30 && !gone) {
                memset(l.runner_id, 0, sizeof l.runner_id);
                l.has_runner = false;
                node_read_state(n, look_fn, &l);
                seen_failed = seen_failed || (l.has_runner && l.status == CLUSTER_RUNNER_FAILED);
                gone = !l.has_instance && worker_count(w) == 0;
                if (!gone)
                    sleep_ms(20);
            }
            CHECK(gone, "a runner that always fails: instance deleted and runner dropped within 30 s "
                        "(instance %d, held %zu)", l.has_instance, worker_count(w));
            printf("  always-failing runner: instance deleted %.2f s after placement (Failed seen: %d)\n",
                   clock_sec() - t0, seen_failed);
        }
    } else if (!place(n, "tiny", inst)) {
        struct look l = {.instance_id = inst};
        double t0 = clock_sec(), took = -1;
        while (clock_sec() - t0 < 30) {
            memset(l.runner_id, 0, sizeof l.runner_id);
            node_read_state(n, look_fn, &l);
            if (l.has_runner && l.status == CLUSTER_RUNNER_READY) {
                took = clock_sec() - t0;
                break;
            }
            sleep_ms(50);
        }
        CHECK(took >= 0, "runner %s Ready in the state within 30 s (last: runner %d status %s '%s')",
              l.runner_id, l.has_runner, cluster_runner_status_name(l.status), l.error);
        printf("  runner Ready in the state %.2f s after PlaceInstance\n", took);
        pid_t pid = worker_runner_pid(w, l.runner_id);
        CHECK(pid > 0 && kill(pid, 0) == 0, "runner process %d alive", (int)pid);

        /* Killed: it restarts after 100 ms, well before the next report may go (at most
         * one per NODE_REPORT_MIN_MS), yet the state shows it Failed, then Ready again. */
        if (pid > 0)
            kill(pid, SIGKILL);
        bool seen_failed = false;
        t0 = clock_sec();
        took = -1;
        while (clock_sec() - t0 < 30) {
            node_read_state(n, look_fn, &l);
            if (l.has_runner && l.status == CLUSTER_RUNNER_FAILED && !seen_failed) {
                seen_failed = true;
                CHECK(strstr(l.error, "SIGKILL") != NULL, "the Failed runner's error names the signal: '%s'",
                      l.error);
            }
            pid_t now_pid = worker_runner_pid(w, l.runner_id);
            if (seen_failed && l.has_runner && l.status == CLUSTER_RUNNER_READY && now_pid > 0 && now_pid != pid) {
                took = clock_sec() - t0;
                break;
            }
            sleep_ms(10);
        }
        CHECK(seen_failed, "the killed runner was reported Failed (last status %s)",
              cluster_runner_status_name(l.status));
        CHECK(took >= 0, "the killed runner Ready again within 30 s (last: %s, pid %d, was %d)",
              cluster_runner_status_name(l.status), (int)worker_runner_pid(w, l.runner_id), (int)pid);
        pid = worker_runner_pid(w, l.runner_id);

        struct command c;
        struct command_result res;
        command_init(&c, COMMAND_DELETE_INSTANCE);
        snprintf(c.delete_instance.instance_id, sizeof c.delete_instance.instance_id, "%s", inst);
        rc = node_command(n, &c, 5000, &res);
        command_clear(&c);
        CHECK(rc == 0, "DeleteInstance: %d %s", rc, res.message);
        t0 = clock_sec();
        took = -1;
        while (clock_sec() - t0 < 30) {
            node_read_state(n, look_fn, &l);
            bool gone = pid <= 0 || (kill(pid, 0) != 0 && errno == ESRCH);
            if (!l.has_instance && !l.has_runner && gone && worker_count(w) == 0) {
                took = clock_sec() - t0;
                break;
            }
            sleep_ms(50);
        }
        CHECK(took >= 0, "after DeleteInstance: process %d gone and runner removed (instance %d runner %d "
                         "held %zu)", (int)pid, l.has_instance, l.has_runner, worker_count(w));
        printf("  runner gone from the state %.2f s after DeleteInstance\n", took);
    }

    worker_stop(w);
    node_release(n);
    worker_release(w);
}

int main(int argc, char **argv)
{
    test_begin(argc, argv);
    log_set_level(LOG_WARN);
    if (access(CAIRN_BINARY, X_OK) != 0) {
        printf("skip: %s is missing\n", CAIRN_BINARY);
        return test_main_end();
    }
    snprintf(root, sizeof root, "/tmp/cairn-test-worker-%d", (int)getpid());
    mkdir(root, 0700);
    char models[512], path[700];
    snprintf(models, sizeof models, "%s/models", root);
    mkdir(models, 0700);
    snprintf(path, sizeof path, "%s/tiny.gguf", models);
    struct synth_spec sp;
    memset(&sp, 0, sizeof sp);
    synth_shape("tiny", &sp);
    sp.n_layers = 2;
    sp.vocab_size = 512;
    sp.seed = 5;
    snprintf(sp.type, sizeof sp.type, "q8_0");
    int rc = synth_write(&sp, NULL, path, err, sizeof err);
    CHECK(rc == 0, "synth_write: %s", err);
    if (!rc) {
        RUN(test_worker, models, false);
        RUN(test_worker, models, true);
    }
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", root);
    return test_main_end();
}
