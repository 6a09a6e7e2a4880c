/*
 * Instructions executed by the guest, read out at marker syscalls.
 *
 * The count is QEMU's tests/plugin/insn.c's inline one (one add per executed
 * guest instruction). A guest marks a point by making the syscall MARK_SYSCALL
 * (a number no kernel has, so QEMU answers ENOSYS and nothing else happens)
 * with an identifier as its first argument; each mark appends
 * "mark <identifier> <instructions so far>" to the file named by out=PATH,
 * and the exit appends "total <instructions>". Counts of one process are
 * deterministic when one guest thread runs: several would race on the count.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <qemu-plugin.h>

#define MARK_SYSCALL 0x4d4f45 /* also in benchmarks/insn_worker.py */

QEMU_PLUGIN_EXPORT int qemu_plugin_version = QEMU_PLUGIN_VERSION;

static uint64_t executed;
static FILE *out;

static void tb_trans(qemu_plugin_id_t id, struct qemu_plugin_tb *tb)
{
    size_t n = qemu_plugin_tb_n_insns(tb);
    for (size_t i = 0; i < n; i++) {
        qemu_plugin_register_vcpu_insn_exec_inline(qemu_plugin_tb_get_insn(tb, i),
                                                   QEMU_PLUGIN_INLINE_ADD_U64, &executed, 1);
    }
}

static void syscall_cb(qemu_plugin_id_t id, unsigned int vcpu, int64_t num, uint64_t a1, uint64_t a2,
                       uint64_t a3, uint64_t a4, uint64_t a5, uint64_t a6, uint64_t a7, uint64_t a8)
{
    if (num == MARK_SYSCALL) {
        fprintf(out, "mark %" PRIu64 " %" PRIu64 "\n", a1, executed);
        fflush(out);
    }
}

static void at_exit(qemu_plugin_id_t id, void *data)
{
    fprintf(out, "total %" PRIu64 "\n", executed);
    fclose(out);
}

QEMU_PLUGIN_EXPORT int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info, int argc, char **argv)
{
    const char *path = NULL;
    for (int i = 0; i < argc; i++) {
        if (strncmp(argv[i], "out=", 4) == 0) {
            path = argv[i] + 4;
        } else {
            fprintf(stderr, "insn_regions: unknown argument %s (expected out=PATH)\n", argv[i]);
            return -1;
        }
    }
    if (path == NULL) {
        fprintf(stderr, "insn_regions: out=PATH is required\n");
        return -1;
    }
    out = fopen(path, "w");
    if (out == NULL) {
        perror(path);
        return -1;
    }
    qemu_plugin_register_vcpu_tb_trans_cb(id, tb_trans);
    qemu_plugin_register_vcpu_syscall_cb(id, syscall_cb);
    qemu_plugin_register_atexit_cb(id, at_exit, NULL);
    return 0;
}
