/* Every Landlock ruleset the service applies, in one place: sandbox-exec (csrc/sandbox_exec.c) is
 * the only program that includes it, and every process the service confines with Landlock is
 * started through that program. Two policies:
 *
 *   LL_COMMAND  a peer's command (ShellExec, shell.run, plan steps, hooks): the last of the walls,
 *               applied in the command's own process after the namespaces, the private mount view
 *               and the dropped capabilities. With fs: read and execute beneath /, write only
 *               beneath the writable directories, no device nodes anywhere; with net_off: no TCP
 *               bind or connect.
 *   LL_READS    a process a file tool starts (fs.search's rg), which walks the workspace by path:
 *               it may read and list only beneath the given directories, read and execute its own
 *               program and the dynamic loader's files, and write, bind or connect nowhere. A
 *               racer swapping a directory for a symlink to outside then leads it to nothing it
 *               can open.
 *
 * Every right the kernel's ABI knows is handled (denied unless a rule grants it). What was applied
 * is recorded in a struct ll_applied, which sandbox-exec --ruleset-out writes down: tests compare
 * the rulesets each path applied.
 *
 * No stdio, no malloc. On failure ll_restrict() returns -1 with errno set, *step naming the system
 * call and *what the path (or ""), so the caller reports it.
 */
#ifndef SMITH_FAST_LANDLOCK_POLICY_H
#define SMITH_FAST_LANDLOCK_POLICY_H

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

/* The same numbers on every architecture (the unified system call table, Linux >= 5.13). */
#define SYS_ll_create 444
#define SYS_ll_add_rule 445
#define SYS_ll_restrict 446

#define FS_EXECUTE (1ULL << 0)
#define FS_WRITE_FILE (1ULL << 1)
#define FS_READ_FILE (1ULL << 2)
#define FS_READ_DIR (1ULL << 3)
#define FS_MAKE_CHAR (1ULL << 6)
#define FS_MAKE_BLOCK (1ULL << 11)
#define FS_REFER (1ULL << 13)
#define FS_TRUNCATE (1ULL << 14)
#define FS_IOCTL_DEV (1ULL << 15)
#define FILE_RIGHTS (FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV)
#define READ (FS_EXECUTE | FS_READ_FILE | FS_READ_DIR)
#define LIST (FS_READ_FILE | FS_READ_DIR)
#define DEVICE (FS_READ_FILE | FS_WRITE_FILE | FS_TRUNCATE | FS_IOCTL_DEV)
#define NET_BIND_TCP (1ULL << 0)
#define NET_CONNECT_TCP (1ULL << 1)
#define SCOPE_ABSTRACT_UNIX (1ULL << 0)
#define SCOPE_SIGNAL (1ULL << 1)

enum ll_policy { LL_COMMAND, LL_READS };

/* Rules a ruleset may hold: the fixed ones below, the caller's directories, a program. */
#define LL_MAX_RULES 96

struct ruleset_attr {
    uint64_t handled_access_fs;
    uint64_t handled_access_net;
    uint64_t scoped;
};
struct path_beneath_attr {
    uint64_t allowed_access;
    int32_t parent_fd;
} __attribute__((packed));

/* What a call of ll_restrict() applied: the ABI, the handled rights and every rule added, with the
 * rights it granted (a path that does not exist adds none, and is not listed). */
struct ll_applied {
    long abi;
    uint64_t handled_fs, handled_net, scoped;
    int nrules;
    struct {
        const char *path;
        uint64_t access;
    } rules[LL_MAX_RULES];
};

/* The device files of the private /dev that commands may read, write and ioctl. */
static const char *const DEVICES[] = {"/dev/null", "/dev/zero", "/dev/full", "/dev/tty", "/dev/ptmx",
                                      "/dev/random", "/dev/urandom", "/dev/console"};

/* What the dynamic loader reads to start a program (LL_READS: its program is not confined by a
 * mount view, so only these and the program itself may be executed). */
static const char *const LOADER[] = {"/lib", "/lib64", "/usr/lib", "/usr/lib64", "/usr/local/lib",
                                     "/etc/ld.so.cache", "/dev/null"};

/* Every right the ABI knows. Handled, so denied unless a rule grants it. */
static uint64_t fs_handled(long abi) {
    uint64_t r = (1ULL << 13) - 1;
    if (abi >= 2) r |= FS_REFER;
    if (abi >= 3) r |= FS_TRUNCATE;
    if (abi >= 5) r |= FS_IOCTL_DEV;
    return r;
}

/* What a writable directory grants: everything but making device nodes, which no rule grants
 * (the namespaces refuse mknod of a device already; this is the second wall). */
static uint64_t fs_writable(long abi) { return fs_handled(abi) & ~(FS_MAKE_CHAR | FS_MAKE_BLOCK); }

/* The kernel's Landlock ABI version, 0 when it has none (or it is disabled). */
static long ll_abi(void) {
    long abi = syscall(SYS_ll_create, NULL, 0, 1 /* LANDLOCK_CREATE_RULESET_VERSION */);
    return abi > 0 ? abi : 0;
}

static int ll_fail(const char **step, const char **what, const char *s, const char *w) {
    *step = s;
    *what = w;
    return -1;
}

static int add_rule(int ruleset, const char *path, uint64_t rights, struct ll_applied *out, const char **step,
                    const char **what) {
    struct stat st;
    struct path_beneath_attr attr;
    int fd = open(path, O_PATH | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT || errno == ENXIO) return 0;
        return ll_fail(step, what, "open", path);
    }
    attr.allowed_access = rights & out->handled_fs;
    if (fstat(fd, &st) == 0 && !S_ISDIR(st.st_mode)) attr.allowed_access &= FILE_RIGHTS;
    attr.parent_fd = fd;
    if (attr.allowed_access && syscall(SYS_ll_add_rule, ruleset, 1 /* PATH_BENEATH */, &attr, 0) != 0) {
        int saved = errno;
        close(fd);
        errno = saved;
        return ll_fail(step, what, "landlock_add_rule", path);
    }
    close(fd);
    if (!attr.allowed_access) return 0;
    if (out->nrules >= LL_MAX_RULES) {
        errno = E2BIG;
        return ll_fail(step, what, "too many Landlock rules at", path);
    }
    out->rules[out->nrules].path = path;
    out->rules[out->nrules].access = attr.allowed_access;
    out->nrules++;
    return 0;
}

/* The rules of a policy (the ruleset's handled rights are in out already). */
static int add_rules(int ruleset, enum ll_policy policy, const char *const *dirs, int ndirs, const char *program,
                     struct ll_applied *out, const char **step, const char **what) {
    int rc = 0;
    if (policy == LL_READS) {
        for (int d = 0; rc == 0 && d < ndirs; d++) rc = add_rule(ruleset, dirs[d], LIST, out, step, what);
        if (rc == 0 && program) rc = add_rule(ruleset, program, FS_EXECUTE | FS_READ_FILE, out, step, what);
        for (size_t l = 0; rc == 0 && l < sizeof LOADER / sizeof *LOADER; l++)
            rc = add_rule(ruleset, LOADER[l], READ, out, step, what);
        return rc;
    }
    rc = add_rule(ruleset, "/", READ, out, step, what);
    for (size_t d = 0; rc == 0 && d < sizeof DEVICES / sizeof *DEVICES; d++)
        rc = add_rule(ruleset, DEVICES[d], DEVICE, out, step, what);
    if (rc == 0) rc = add_rule(ruleset, "/dev/pts", DEVICE | FS_READ_DIR, out, step, what);
    for (int w = 0; rc == 0 && w < ndirs; w++) rc = add_rule(ruleset, dirs[w], fs_writable(out->abi), out, step, what);
    return rc;
}

/* The ruleset of a policy, not applied yet: its fd (close-on-exec), LL_NONE when the policy needs
 * none (neither fs nor net_off: only no_new_privs), -1 on failure.
 *
 * LL_COMMAND: fs confines files (dirs: the writable directories), net_off denies TCP bind and
 * connect. LL_READS: dirs are the readable directories and program the one program it may run; fs
 * and net_off are implied. Scopes where the ABI has them: signals (when files are confined),
 * abstract Unix sockets always, because with the host's network its services (D-Bus, X11, container
 * runtimes) would be in reach. out (required) receives what the ruleset holds. A zygote builds it
 * once (its paths resolved in its mount view) and applies it in each command (ll_apply). */
#define LL_NONE (-2)

static int ll_build(enum ll_policy policy, int fs, int net_off, const char *const *dirs, int ndirs,
                    const char *program, struct ll_applied *out, const char **step, const char **what) {
    memset(out, 0, sizeof *out);
    if (policy == LL_READS) fs = net_off = 1;
    if (!fs && !net_off) return LL_NONE;
    out->abi = ll_abi();
    if (out->abi < 1) {
        errno = EOPNOTSUPP;
        return ll_fail(step, what, "the kernel has no Landlock", "");
    }
    struct ruleset_attr attr = {0, 0, 0};
    size_t size = out->abi >= 6 ? 24 : out->abi >= 4 ? 16 : 8;
    attr.handled_access_fs = fs ? fs_handled(out->abi) : 0;
    if (net_off && out->abi >= 4) attr.handled_access_net = NET_BIND_TCP | NET_CONNECT_TCP;
    if (out->abi >= 6) attr.scoped = (fs ? SCOPE_SIGNAL : 0) | SCOPE_ABSTRACT_UNIX;
    out->handled_fs = attr.handled_access_fs;
    out->handled_net = attr.handled_access_net;
    out->scoped = attr.scoped;
    if (!(attr.handled_access_fs || attr.handled_access_net || attr.scoped)) return LL_NONE;
    int ruleset = (int)syscall(SYS_ll_create, &attr, size, 0); /* close-on-exec, as every Landlock fd */
    if (ruleset < 0) return ll_fail(step, what, "landlock_create_ruleset", "");
    if (fs && add_rules(ruleset, policy, dirs, ndirs, program, out, step, what) != 0) {
        int saved = errno;
        close(ruleset);
        errno = saved;
        return -1;
    }
    return ruleset;
}

/* Restrict the calling process for good with a built ruleset (or LL_NONE), and set no_new_privs. */
static int ll_apply(int ruleset, const char **step, const char **what) {
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return ll_fail(step, what, "prctl(PR_SET_NO_NEW_PRIVS)", "");
    if (ruleset >= 0 && syscall(SYS_ll_restrict, ruleset, 0) != 0) return ll_fail(step, what, "landlock_restrict_self", "");
    return 0;
}

/* Build and apply at once (the one-shot forms). */
static int ll_restrict(enum ll_policy policy, int fs, int net_off, const char *const *dirs, int ndirs,
                       const char *program, struct ll_applied *out, const char **step, const char **what) {
    int ruleset = ll_build(policy, fs, net_off, dirs, ndirs, program, out, step, what);
    if (ruleset == -1) {
        /* no_new_privs even so: the caller dies, but nothing it runs meanwhile gains privileges */
        int saved = errno;
        prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
        errno = saved;
        return -1;
    }
    int rc = ll_apply(ruleset, step, what);
    if (ruleset >= 0) {
        int saved = errno;
        close(ruleset);
        errno = saved;
    }
    return rc;
}

#endif
