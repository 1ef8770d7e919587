/* The Landlock policy of a sandboxed command: the last of sandbox-exec's walls (csrc/sandbox_exec.c),
 * applied in the command's own process after the namespaces, the private mount view and the
 * dropped capabilities. It is the only copy: nothing else in the service applies a command's policy.
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
#define DEVICE (FS_READ_FILE | FS_WRITE_FILE | FS_TRUNCATE | FS_IOCTL_DEV)
#define NET_BIND_TCP (1ULL << 0)
#define NET_CONNECT_TCP (1ULL << 1)
#define SCOPE_ABSTRACT_UNIX (1ULL << 0)
#define SCOPE_SIGNAL (1ULL << 1)

struct ruleset_attr {
    uint64_t handled_access_fs;
    uint64_t handled_access_net;
    uint64_t scoped;
};
struct path_beneath_attr {
    uint64_t allowed_access;
    int32_t parent_fd;
} __attribute__((packed));

/* The device files of the private /dev that commands may read, write and ioctl. */
static const char *const DEVICES[] = {"/dev/null", "/dev/zero", "/dev/full", "/dev/tty", "/dev/ptmx",
                                      "/dev/random", "/dev/urandom", "/dev/console"};

/* Every right the ABI knows. Handled, so denied unless a rule grants it. */
static uint64_t fs_handled(int abi) {
    uint64_t r = (1ULL << 13) - 1;
    if (abi >= 2) r |= FS_REFER;
    if (abi >= 3) r |= FS_TRUNCATE;
    if (abi >= 5) r |= FS_IOCTL_DEV;
    return r;
}

/* What a writable directory grants: everything but making device nodes, which no rule grants
 * (the namespaces refuse mknod of a device already; this is the second wall). */
static uint64_t fs_writable(int abi) { return fs_handled(abi) & ~(FS_MAKE_CHAR | FS_MAKE_BLOCK); }

static int ll_fail(const char **step, const char **what, const char *s, const char *w) {
    *step = s;
    *what = w;
    return -1;
}

static int add_rule(int ruleset, const char *path, uint64_t rights, uint64_t handled, const char **step,
                    const char **what) {
    struct stat st;
    struct path_beneath_attr attr;
    int fd = open(path, O_PATH | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT || errno == ENXIO) return 0;
        return ll_fail(step, what, "open", path);
    }
    attr.allowed_access = rights & handled;
    if (fstat(fd, &st) == 0 && !S_ISDIR(st.st_mode)) attr.allowed_access &= FILE_RIGHTS;
    attr.parent_fd = fd;
    if (attr.allowed_access && syscall(SYS_ll_add_rule, ruleset, 1 /* PATH_BENEATH */, &attr, 0) != 0) {
        int saved = errno;
        close(fd);
        errno = saved;
        return ll_fail(step, what, "landlock_add_rule", path);
    }
    close(fd);
    return 0;
}

/* Restrict the calling process: with fs, read and execute beneath /, write only beneath
 * writable[] (no device nodes anywhere); with net_off, no TCP bind or connect; scopes (signals when
 * fs, abstract Unix sockets unless net_on) where the ABI has them. Sets no_new_privs. */
static int ll_restrict(int fs, int net_off, int net_on, const char *const *writable, int nwritable,
                       const char **step, const char **what) {
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return ll_fail(step, what, "prctl(PR_SET_NO_NEW_PRIVS)", "");
    if (!fs && !net_off) return 0;
    long abi = syscall(SYS_ll_create, NULL, 0, 1 /* VERSION */);
    if (abi < 1) return ll_fail(step, what, "the kernel has no Landlock", "");
    struct ruleset_attr attr = {0, 0, 0};
    size_t size = abi >= 6 ? 24 : abi >= 4 ? 16 : 8;
    attr.handled_access_fs = fs ? fs_handled((int)abi) : 0;
    if (net_off && abi >= 4) attr.handled_access_net = NET_BIND_TCP | NET_CONNECT_TCP;
    if (abi >= 6) attr.scoped = (fs ? SCOPE_SIGNAL : 0) | (net_on ? 0 : SCOPE_ABSTRACT_UNIX);
    if (!(attr.handled_access_fs || attr.handled_access_net || attr.scoped)) return 0;
    int ruleset = (int)syscall(SYS_ll_create, &attr, size, 0);
    if (ruleset < 0) return ll_fail(step, what, "landlock_create_ruleset", "");
    int rc = 0;
    if (fs) {
        uint64_t all = attr.handled_access_fs;
        rc = add_rule(ruleset, "/", READ, all, step, what);
        for (size_t d = 0; rc == 0 && d < sizeof DEVICES / sizeof *DEVICES; d++)
            rc = add_rule(ruleset, DEVICES[d], DEVICE, all, step, what);
        if (rc == 0) rc = add_rule(ruleset, "/dev/pts", DEVICE | FS_READ_DIR, all, step, what);
        for (int w = 0; rc == 0 && w < nwritable; w++)
            rc = add_rule(ruleset, writable[w], fs_writable((int)abi), all, step, what);
    }
    if (rc == 0 && syscall(SYS_ll_restrict, ruleset, 0) != 0) rc = ll_fail(step, what, "landlock_restrict_self", "");
    int saved = errno;
    close(ruleset);
    errno = saved;
    return rc;
}

#endif
