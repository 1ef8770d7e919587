/* sandbox-exec: the C twin of smith_fast/sandbox/exec.py (same arguments, same policy).
 *
 *   sandbox-exec [--write DIR]... [--read PATH]... [--fs on|off] [--network on|off|loopback] [--probe] -- PROGRAM ARG...
 *
 * Network namespace first (unshare needs a single-threaded process), then Landlock
 * (PR_SET_NO_NEW_PRIVS + landlock_restrict_self), then execv. Any failure: one line on stderr and
 * exit status 126 (127: PROGRAM not found); nothing runs unrestricted. It exists because a Python
 * interpreter start-up per command costs ~100x a plain spawn (bench/bench_sandbox.py); this costs
 * about one more exec. Built by setup.py next to exec.py; the service falls back to exec.py
 * without it. Keep the policy identical to exec.py's apply().
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
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

static const char *const DEVICES[] = {"/dev/null", "/dev/zero", "/dev/full", "/dev/tty", "/dev/ptmx",
                                      "/dev/random", "/dev/urandom"};

static void die(int code, const char *fmt, const char *arg) {
    fprintf(stderr, "smith-fast sandbox: ");
    fprintf(stderr, fmt, arg, strerror(errno));
    fputc('\n', stderr);
    _exit(code);
}

static uint64_t fs_rights(int abi) {
    uint64_t r = (1ULL << 13) - 1;
    if (abi >= 2) r |= FS_REFER;
    if (abi >= 3) r |= FS_TRUNCATE;
    if (abi >= 5) r |= FS_IOCTL_DEV;
    return r;
}

static void write_file(const char *path, const char *text) {
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0 || write(fd, text, strlen(text)) < 0) die(126, "cannot restrict the command: writing %s: %s", path);
    close(fd);
}

static void enter_netns(int loopback) {
    char map[64];
    uid_t uid = getuid();
    gid_t gid = getgid();
    if (unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0)
        die(126, "cannot restrict the command: unshare(CLONE_NEWUSER|CLONE_NEWNET)%s: %s", "");
    write_file("/proc/self/setgroups", "deny");
    snprintf(map, sizeof map, "%u %u 1", (unsigned)uid, (unsigned)uid);
    write_file("/proc/self/uid_map", map);
    snprintf(map, sizeof map, "%u %u 1", (unsigned)gid, (unsigned)gid);
    write_file("/proc/self/gid_map", map);
    if (loopback) {
        struct ifreq ifr;
        int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        memset(&ifr, 0, sizeof ifr);
        strcpy(ifr.ifr_name, "lo");
        if (s < 0 || ioctl(s, SIOCGIFFLAGS, &ifr) != 0) die(126, "cannot restrict the command: %sSIOCGIFFLAGS: %s", "");
        ifr.ifr_flags |= IFF_UP;
        if (ioctl(s, SIOCSIFFLAGS, &ifr) != 0) die(126, "cannot restrict the command: %sSIOCSIFFLAGS: %s", "");
        close(s);
    }
}

static void add_rule(int ruleset, const char *path, uint64_t rights, uint64_t handled, int follow) {
    struct stat st;
    struct path_beneath_attr attr;
    int fd = open(path, O_PATH | O_CLOEXEC | (follow ? 0 : O_NOFOLLOW));
    if (fd < 0) {
        if (errno == ENOENT || errno == ENXIO) return;
        die(126, "cannot restrict the command: open(%s): %s", path);
    }
    attr.allowed_access = rights & handled;
    if (fstat(fd, &st) == 0 && !S_ISDIR(st.st_mode)) attr.allowed_access &= FILE_RIGHTS;
    attr.parent_fd = fd;
    if (attr.allowed_access && syscall(SYS_ll_add_rule, ruleset, 1 /* PATH_BENEATH */, &attr, 0) != 0)
        die(126, "cannot restrict the command: landlock_add_rule(%s): %s", path);
    close(fd);
}

int main(int argc, char **argv) {
    const char **writable = calloc((size_t)argc, sizeof *writable);
    const char **readable = calloc((size_t)argc, sizeof *readable);
    int nwritable = 0, nreadable = 0, fs = 1, probe = 0, i = 1;
    if (writable == NULL || readable == NULL) die(126, "cannot restrict the command: %sout of memory: %s", "");
    const char *network = "on";
    for (; i < argc; i++) {
        if (strcmp(argv[i], "--") == 0) { i++; break; }
        if (strcmp(argv[i], "--probe") == 0) { probe = 1; continue; }
        if (i + 1 >= argc) goto usage;
        if (strcmp(argv[i], "--write") == 0) writable[nwritable++] = argv[++i];
        else if (strcmp(argv[i], "--read") == 0) readable[nreadable++] = argv[++i];
        else if (strcmp(argv[i], "--fs") == 0 && (!strcmp(argv[i + 1], "on") || !strcmp(argv[i + 1], "off")))
            fs = strcmp(argv[++i], "on") == 0;
        else if (strcmp(argv[i], "--network") == 0 &&
                 (!strcmp(argv[i + 1], "on") || !strcmp(argv[i + 1], "off") || !strcmp(argv[i + 1], "loopback")))
            network = argv[++i];
        else goto usage;
    }
    if (!probe && i >= argc) goto usage;

    int net_off = strcmp(network, "off") == 0, net_on = strcmp(network, "on") == 0;
    if (!net_on) enter_netns(!net_off);
    if (fs || net_off) {
        long abi = syscall(SYS_ll_create, NULL, 0, 1 /* VERSION */);
        if (abi < 1) die(126, "cannot restrict the command: %sthe kernel has no Landlock: %s", "");
        struct ruleset_attr attr = {0, 0, 0};
        size_t size = abi >= 6 ? 24 : abi >= 4 ? 16 : 8;
        attr.handled_access_fs = fs ? fs_rights((int)abi) : 0;
        if (net_off && abi >= 4) attr.handled_access_net = NET_BIND_TCP | NET_CONNECT_TCP;
        if (abi >= 6) attr.scoped = (fs ? SCOPE_SIGNAL : 0) | (net_on ? 0 : SCOPE_ABSTRACT_UNIX);
        if (attr.handled_access_fs || attr.handled_access_net || attr.scoped) {
            int ruleset = (int)syscall(SYS_ll_create, &attr, size, 0);
            if (ruleset < 0) die(126, "cannot restrict the command: %slandlock_create_ruleset: %s", "");
            if (fs) {
                uint64_t all = attr.handled_access_fs;
                /* --read: what may be read and executed (default: everything beneath /) */
                /* --read paths are not followed: one swapped for a symlink after the service listed
                   it must not grant what the link points to */
                if (nreadable == 0) add_rule(ruleset, "/", READ, all, 1);
                for (int r = 0; r < nreadable; r++) add_rule(ruleset, readable[r], READ, all, 0);
                for (size_t d = 0; d < sizeof DEVICES / sizeof *DEVICES; d++) add_rule(ruleset, DEVICES[d], DEVICE, all, 1);
                add_rule(ruleset, "/dev/pts", DEVICE | FS_READ_DIR, all, 1);
                for (int w = 0; w < nwritable; w++) add_rule(ruleset, writable[w], all, all, 1);
            }
            if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) die(126, "cannot restrict the command: %sprctl: %s", "");
            if (syscall(SYS_ll_restrict, ruleset, 0) != 0) die(126, "cannot restrict the command: %slandlock_restrict_self: %s", "");
            close(ruleset);
        }
    }
    if (probe) return 0;
    execv(argv[i], argv + i);
    die(errno == ENOENT ? 127 : 126, "cannot run '%s': %s", argv[i]);
usage:
    fprintf(stderr, "smith-fast sandbox: usage: sandbox-exec [--write DIR]... [--read PATH]... [--fs on|off] [--network on|off|loopback] [--probe] -- PROGRAM ARG...\n");
    return 2;
}
