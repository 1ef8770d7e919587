/* sandbox-exec: the C twin of smith_fast/sandbox/exec.py (same arguments, same policy).
 *
 *   sandbox-exec [--write DIR]... [--read PATH]... [--fs on|off] [--network on|off|loopback] [--probe] -- PROGRAM ARG...
 *
 * Network namespace first (unshare needs a single-threaded process), then Landlock
 * (PR_SET_NO_NEW_PRIVS + landlock_restrict_self), then execv. Any failure: one line on stderr and
 * exit status 126 (127: PROGRAM not found); nothing runs unrestricted. It exists because a Python
 * interpreter start-up per command costs ~100x a plain spawn (bench/bench_sandbox.py); this costs
 * about one more exec. Built by setup.py next to exec.py; the service falls back to exec.py
 * without it. The Landlock policy is landlock_policy.h, shared with the in-process spawner
 * (sandbox_spawn.c); keep it identical to exec.py's apply().
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

#include "landlock_policy.h"

static void die(int code, const char *fmt, const char *arg) {
    fprintf(stderr, "smith-fast sandbox: ");
    fprintf(stderr, fmt, arg, strerror(errno));
    fputc('\n', stderr);
    _exit(code);
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
    const char *step = "", *what = "";
    if (ll_restrict(fs, net_off, net_on, readable, nreadable, writable, nwritable, &step, &what) != 0) {
        if (*what) {
            fprintf(stderr, "smith-fast sandbox: cannot restrict the command: %s(%s): %s\n", step, what, strerror(errno));
            _exit(126);
        }
        die(126, "cannot restrict the command: %s: %s", step);
    }
    if (probe) return 0;
    execv(argv[i], argv + i);
    die(errno == ENOENT ? 127 : 126, "cannot run '%s': %s", argv[i]);
usage:
    fprintf(stderr, "smith-fast sandbox: usage: sandbox-exec [--write DIR]... [--read PATH]... [--fs on|off] [--network on|off|loopback] [--probe] -- PROGRAM ARG...\n");
    return 2;
}
