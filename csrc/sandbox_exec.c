/* sandbox-exec: every process the service starts for a peer starts through this program.
 *
 *   sandbox-exec [--write DIR]... [--read DIR]... [--hide PATH]... [--cover DIR]... [--fs on|off]
 *                [--network on|off|loopback|allow] [--egress-fd FD] [--tmp-size BYTES] [--file-size BYTES] [--data-size BYTES] [--open-files N] [--usage-fd FD] [--tty]
 *                [--cgroup-fd FD] [--reap] [--env-prefixed] [--probe] [--ruleset-out FILE] -- PROGRAM ARG...
 *   sandbox-exec --only-read DIR [--only-read DIR]... [--file-size BYTES] [--data-size BYTES] [--probe]
 *                [--ruleset-out FILE] -- PROGRAM ARG...
 *   sandbox-exec --zygote CONTROL_FD [the first form's options but --tty, --usage-fd and --cgroup-fd, no PROGRAM]
 *
 * It builds the walls bubblewrap builds (what Flatpak, Codex and Anthropic's sandbox runtime use),
 * in one small C program so that the service pays one exec for them, then Landlock as the last wall:
 *
 * --network allow (with --egress-fd FD, a unix socket of the service's): loopback alone, as with
 * loopback; the init makes the egress listener inside the namespace and sends it over FD
 * (egress_listener.h), and supervises the command's connect() calls (unix_guard.h: a socket file
 * outside the writable directories is refused).
 *
 *   monitor (this process, the service's child): starts the init in a new user namespace (the
 *     caller's uid and gid mapped onto themselves: files keep their owners, and capabilities held
 *     in it mean nothing to the host's devices, network or files), a mount, pid, IPC and UTS
 *     namespace, and a network namespace unless --network on (with loopback: lo up), staying in
 *     the host's itself (its exit then costs nothing). Blocks every signal,
 *     waits for the command's status and ends as the command ended: its exit status, or killed by
 *     the same signal (with --reap only once the init is reaped: see monitor()); with --usage-fd it
 *     first writes there the command's struct rusage, which its parent's wait4() cannot see.
 *   init (pid 1 of the new pid namespace): the private view of the system (mount_view below), then
 *     forks the command; forwards every signal it gets (the service signals the monitor's process
 *     group, which the init is in) to the command's process group; reaps orphans; when the command
 *     ends it hands its wait status to the monitor and exits, and the kernel kills whatever is
 *     left in the namespace: no process outlives the command.
 *   command: a session of its own (with --tty the terminal on fd 0 as its controlling terminal),
 *     every capability dropped (bounding, ambient, effective, permitted, inheritable; securebits
 *     locked so that uid 0 gets none back at exec), no_new_privs, Landlock (landlock_policy.h),
 *     RLIMIT_FSIZE (and RLIMIT_DATA), then execv with the fds it was given (this program's own are
 *     close-on-exec). No PATH search: PROGRAM is a path.
 *
 * The mount view: the host's tree recursively read-only, nosuid and nodev (with --fs on; with
 * --fs off it stays writable), except the --write directories (--read ones are kept in view, read-only,
 * where they lie under the private /tmp); a private /proc of the new pid
 * namespace (no other process, no other environ); a private /dev (null, zero, full, random,
 * urandom, tty bound from the host, and with --tty the command's terminal as console; a devpts
 * instance of its own with ptmx; shm) made read-only;
 * an empty read-only /run (the host's service sockets live there; the resolver's configuration is
 * kept); with --fs on a private /tmp (a tmpfs of --tmp-size bytes, which is the command's TMPDIR); every
 * --hide path covered by an empty, unreadable file or directory.
 *
 * --cover DIR (absolute, repeatable): DIR is covered by an empty read-only tmpfs (noexec),
 * in which only the --write and --read directories that lie beneath DIR are made (the path to each,
 * then the directory itself attached): DIR is the service's workspaces directory, and a command of one
 * session sees its own workspace root there and nothing else (other sessions, layers, templates).
 * The cover is made read-only after the attaches, not recursively: the --write trees stay writable.
 * Like every mount of the view it is locked to the init's user namespace: a command cannot unmount it,
 * not even from a user namespace of its own.
 *
 * The third form is a session's sandbox built once (a zygote, below: zygote()): the monitor and the
 * init as in the first form, but the init forks one command per request on CONTROL_FD, each set up
 * as the first form's command is (run_command), until the socket's EOF. What is the same for every
 * command the init does once, for them to inherit (prepare_commands): signal dispositions reset,
 * securebits, the bounding and ambient sets dropped (its own effective set stays: it never execs),
 * the Landlock ruleset built (applied by each command); a command then costs ~10 system calls
 * before its exec, not ~200.
 *
 * The second form is Landlock alone (landlock_policy.h's LL_READS), for a process a file tool starts
 * (fs.search's rg): no namespace, no fork, one exec. PROGRAM may read and list only beneath the
 * --only-read directories, run only itself (and the dynamic loader's files), write, bind and
 * connect nowhere. When it is started with capabilities (uid 0 of the service's own user namespace,
 * under --workspaces, may hold some there) they are dropped first, as for a command.
 *
 * Any failure before the command runs: one line on stderr and exit status 126 (127: PROGRAM not
 * found); nothing runs with fewer walls than asked for. --probe builds everything, drops into the
 * command's confinement and exits 0 there instead of running anything: the service's start-up check.
 * --ruleset-out FILE appends to FILE one JSON line of the Landlock ruleset applied (landlock_policy.h's
 * struct ll_applied), written from the confined process once it is confined: what tests compare.
 *
 * --env-prefixed (the first form): the command's environment is this program's variables named
 * SMITH_FAST_ENV_NAME, as NAME; the rest of this program's environment is not the command's. The
 * service starts it so (Sandbox.wrap): a request's variables are read by the command alone, never
 * by this program's own dynamic loader and C library, which run before any wall stands (with
 * --allow-env LD_PRELOAD, a request's library ran here, outside the sandbox, as the service's user).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "egress_listener.h"
#include "landlock_policy.h"
#include "unix_guard.h"

/* The new mount API (Linux 5.2; mount_setattr 5.12), by number: glibc's headers for it clash with
 * <sys/mount.h> on older releases, and the numbers are the same on every architecture. */
#define SYS_open_tree_ 428
#define SYS_move_mount_ 429
#define SYS_fsopen_ 430
#define SYS_fsconfig_ 431
#define SYS_fsmount_ 432
#define SYS_mount_setattr_ 442
#define OPEN_TREE_CLONE_ 1
#define AT_RECURSIVE_ 0x8000
#define MOVE_MOUNT_F_EMPTY_PATH_ 0x4
#define FSCONFIG_SET_STRING_ 1
#define FSCONFIG_CMD_CREATE_ 6
#define MOUNT_ATTR_RDONLY_ 0x1
#define MOUNT_ATTR_NOSUID_ 0x2
#define MOUNT_ATTR_NODEV_ 0x4
#define MOUNT_ATTR_NOEXEC_ 0x8

#define FAILED 126
#define NOT_FOUND 127
#define MAX_WRITE 64

struct mount_attr_ {
    uint64_t attr_set;
    uint64_t attr_clr;
    uint64_t propagation;
    uint64_t userns_fd;
};

static struct {
    const char *write[MAX_WRITE];
    int nwrite;
    const char *read[MAX_WRITE];
    int nread;
    const char **hide;
    int nhide;
    const char *cover[MAX_WRITE]; /* --cover: tmpfs over DIR, holding only the write/read dirs beneath it */
    int ncover;
    const char *only[MAX_WRITE]; /* --only-read: the LL_READS form */
    int nonly;
    int view; /* an option of the first form was given */
    int fs, net_off, net_on, loopback, tty, probe, reap, usage_fd, ruleset_fd;
    int zygote_fd; /* --zygote: the control socket; -1: the one-shot form */
    int cgroup_fd; /* --cgroup-fd: a cgroup v2 directory the init is born in; -1: none */
    int egress_fd; /* --network allow: where the egress listener is sent (egress_listener.h) */
    int guard[2];  /* --network allow: the unix guard's channel, command -> init (unix_guard.h) */
    unsigned long long tmp_size, file_size, data_size;
    unsigned long long open_files; /* --open-files: the command's soft RLIMIT_NOFILE at most (0: as inherited) */
    char cwd[4096];
    char tty_name[256]; /* the command's terminal (--tty), bound to /dev/console in its view */
    char *const *argv;
    char **envp; /* the command's environment: environ, or with --env-prefixed what command_env() makes */
} o;

static void die(int code, const char *what, const char *arg) {
    int saved = errno;
    fprintf(stderr, "smith-fast sandbox: %s%s%s%s%s\n", what, *arg ? " " : "", arg, saved ? ": " : "",
            saved ? strerror(saved) : "");
    _exit(code);
}

static void write_file(const char *path, const char *text) {
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0 || write(fd, text, strlen(text)) < 0) die(FAILED, "cannot restrict the command: writing", path);
    close(fd);
}

static int setattr(int dfd, const char *path, unsigned flags, uint64_t set) {
    struct mount_attr_ attr = {set, 0, 0, 0};
    return (int)syscall(SYS_mount_setattr_, dfd, path, flags, &attr, sizeof attr);
}

/* A detached copy of the mount tree at path (with what is mounted beneath it), to attach later. */
static int clone_tree(const char *path, int recursive) {
    return (int)syscall(SYS_open_tree_, AT_FDCWD, path, OPEN_TREE_CLONE_ | O_CLOEXEC | (recursive ? AT_RECURSIVE_ : 0));
}

static void attach(int tree, const char *path) {
    if (syscall(SYS_move_mount_, tree, "", AT_FDCWD, path, MOVE_MOUNT_F_EMPTY_PATH_) != 0)
        die(FAILED, "cannot restrict the command: move_mount to", path);
    close(tree);
}

static void mkdirs(const char *path) {
    char buf[4096];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof buf) return;
    memcpy(buf, path, n + 1);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        mkdir(buf, 0755);
        *p = '/';
    }
    mkdir(buf, 0755);
}

static void mount_tmpfs(const char *path, const char *options, unsigned long flags) {
    if (mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV | flags, options) != 0)
        die(FAILED, "cannot restrict the command: mounting a tmpfs on", path);
}

/* An unreadable empty directory ("dir") and file ("file") on a detached read-only tmpfs: what a
 * --hide path is covered with. */
static int make_mask(void) {
    int fs = (int)syscall(SYS_fsopen_, "tmpfs", 1 /* FSOPEN_CLOEXEC */);
    if (fs < 0) die(FAILED, "cannot restrict the command: fsopen(tmpfs)", "");
    if (syscall(SYS_fsconfig_, fs, FSCONFIG_SET_STRING_, "size", "4k", 0) != 0 ||
        syscall(SYS_fsconfig_, fs, FSCONFIG_SET_STRING_, "mode", "0", 0) != 0 ||
        syscall(SYS_fsconfig_, fs, FSCONFIG_CMD_CREATE_, NULL, NULL, 0) != 0)
        die(FAILED, "cannot restrict the command: fsconfig(tmpfs)", "");
    int mnt = (int)syscall(SYS_fsmount_, fs, 1 /* FSMOUNT_CLOEXEC */, MOUNT_ATTR_NOSUID_ | MOUNT_ATTR_NODEV_ | MOUNT_ATTR_NOEXEC_);
    if (mnt < 0) die(FAILED, "cannot restrict the command: fsmount(tmpfs)", "");
    close(fs);
    int f = openat(mnt, "file", O_CREAT | O_WRONLY | O_CLOEXEC, 0);
    if (f < 0 || mkdirat(mnt, "dir", 0) != 0) die(FAILED, "cannot restrict the command: making the mask", "");
    close(f);
    if (setattr(mnt, "", AT_EMPTY_PATH, MOUNT_ATTR_RDONLY_) != 0) die(FAILED, "cannot restrict the command: mount_setattr(mask)", "");
    return mnt;
}

static void hide(int mask, const char *path) {
    struct stat st;
    if (lstat(path, &st) != 0 || S_ISLNK(st.st_mode)) return; /* nothing there (a link is judged where it leads) */
    int tree = (int)syscall(SYS_open_tree_, mask, S_ISDIR(st.st_mode) ? "dir" : "file", OPEN_TREE_CLONE_ | O_CLOEXEC);
    if (tree < 0) die(FAILED, "cannot restrict the command: open_tree(mask) for", path);
    attach(tree, path);
}

static int under(const char *path, const char *top) {
    size_t n = strlen(top);
    return strncmp(path, top, n) == 0 && (path[n] == '\0' || path[n] == '/');
}

/* Whether path lies beneath (or is) a --cover directory. */
static int covered(const char *path) {
    for (int c = 0; c < o.ncover; c++)
        if (under(path, o.cover[c])) return 1;
    return 0;
}

static void mount_view(void) {
    static const char *const nodes[] = {"null", "zero", "full", "random", "urandom", "tty"};
    enum { NNODES = sizeof nodes / sizeof *nodes };
    int node_tree[NNODES], write_tree[MAX_WRITE], read_tree[MAX_WRITE], console = -1;
    char path[64], opts[96];
    int whole_root = 0;

    if (mount(NULL, "/", NULL, MS_REC | MS_SLAVE, NULL) != 0) die(FAILED, "cannot restrict the command: making / a slave mount", "");
    /* Copies taken before the tree is made read-only keep their own flags. */
    for (int i = 0; i < NNODES; i++) {
        snprintf(path, sizeof path, "/dev/%s", nodes[i]);
        node_tree[i] = clone_tree(path, 0);
        if (node_tree[i] < 0) die(FAILED, "cannot restrict the command: open_tree", path);
    }
    /* /run holds the host's service sockets (docker, systemd, D-Bus, agents under /run/user), which
       a read-only mount does not stop a connect() to, and uid 0 owns most of them: it is replaced by
       an empty tmpfs, keeping only the resolver's configuration when /etc/resolv.conf leads there. */
    char resolv[4096];
    int resolv_tree = -1;
    if (realpath("/etc/resolv.conf", resolv) != NULL && under(resolv, "/run")) resolv_tree = clone_tree(resolv, 0);
    struct stat var_run;
    int own_var_run = lstat("/var/run", &var_run) == 0 && S_ISDIR(var_run.st_mode);
    /* The terminal is the host devpts's, not in the private one: ttyname() finds it as /dev/console. */
    if (o.tty_name[0]) console = clone_tree(o.tty_name, 0);
    for (int w = 0; w < o.nwrite; w++) {
        if (strcmp(o.write[w], "/") == 0) whole_root = 1;
        int keep = !whole_root && (o.fs || covered(o.write[w])); /* with --fs off, only what a cover would hide */
        write_tree[w] = keep ? clone_tree(o.write[w], 1) : -1;
        if (keep && write_tree[w] < 0 && errno != ENOENT) die(FAILED, "cannot restrict the command: open_tree", o.write[w]);
    }
    for (int r = 0; r < o.nread; r++) {
        int keep = (o.fs && under(o.read[r], "/tmp")) || covered(o.read[r]);
        read_tree[r] = keep ? clone_tree(o.read[r], 1) : -1;
        if (read_tree[r] < 0 && keep && errno != ENOENT) die(FAILED, "cannot restrict the command: open_tree", o.read[r]);
    }
    uint64_t walls = MOUNT_ATTR_NOSUID_ | MOUNT_ATTR_NODEV_ | (o.fs && !whole_root ? MOUNT_ATTR_RDONLY_ : 0);
    if (setattr(AT_FDCWD, "/", AT_RECURSIVE_, walls) != 0) die(FAILED, "cannot restrict the command: mount_setattr(/)", "");

    if (mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) != 0)
        die(FAILED, "cannot restrict the command: mounting a private /proc", "");

    mount_tmpfs("/dev", "mode=0755,size=64k", MS_NOEXEC);
    for (int i = 0; i < NNODES; i++) {
        snprintf(path, sizeof path, "/dev/%s", nodes[i]);
        int fd = open(path, O_CREAT | O_WRONLY | O_CLOEXEC, 0666);
        if (fd < 0) die(FAILED, "cannot restrict the command: creating", path);
        close(fd);
        attach(node_tree[i], path);
    }
    if (console >= 0) {
        int fd = open("/dev/console", O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
        if (fd < 0) die(FAILED, "cannot restrict the command: creating", "/dev/console");
        close(fd);
        attach(console, "/dev/console");
    }
    if (mkdir("/dev/pts", 0755) != 0 || mkdir("/dev/shm", 01777) != 0) die(FAILED, "cannot restrict the command: mkdir in /dev", "");
    if (mount("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620") != 0)
        die(FAILED, "cannot restrict the command: mounting a private devpts", "");
    if (symlink("pts/ptmx", "/dev/ptmx") != 0 || symlink("/proc/self/fd", "/dev/fd") != 0 ||
        symlink("/proc/self/fd/0", "/dev/stdin") != 0 || symlink("/proc/self/fd/1", "/dev/stdout") != 0 ||
        symlink("/proc/self/fd/2", "/dev/stderr") != 0)
        die(FAILED, "cannot restrict the command: symlinks in /dev", "");
    snprintf(opts, sizeof opts, "mode=01777,size=%llu", o.tmp_size);
    mount_tmpfs("/dev/shm", opts, 0);
    if (setattr(AT_FDCWD, "/dev", 0, MOUNT_ATTR_RDONLY_) != 0) die(FAILED, "cannot restrict the command: mount_setattr(/dev)", "");

    if (o.fs) mount_tmpfs("/tmp", opts, 0);
    mount_tmpfs("/run", "mode=0755,size=64k", MS_NOEXEC);
    if (own_var_run) mount_tmpfs("/var/run", "mode=0755,size=4k", MS_NOEXEC);
    if (resolv_tree >= 0) {
        char dir[4096];
        snprintf(dir, sizeof dir, "%s", resolv);
        *strrchr(dir, '/') = '\0';
        mkdirs(dir);
        int fd = open(resolv, O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
        if (fd < 0) die(FAILED, "cannot restrict the command: creating", resolv);
        close(fd);
        attach(resolv_tree, resolv);
    }
    if (setattr(AT_FDCWD, "/run", 0, MOUNT_ATTR_RDONLY_) != 0) die(FAILED, "cannot restrict the command: mount_setattr(/run)", "");
    for (int r = 0; r < o.nread; r++) {
        if (read_tree[r] < 0) continue;
        if (setattr(read_tree[r], "", AT_EMPTY_PATH | AT_RECURSIVE_, MOUNT_ATTR_RDONLY_ | MOUNT_ATTR_NOSUID_ | MOUNT_ATTR_NODEV_) != 0)
            die(FAILED, "cannot restrict the command: mount_setattr", o.read[r]);
    }
    /* --read dirs in the fresh /tmp; those beneath a cover are attached once it is there. */
    for (int r = 0; r < o.nread; r++) {
        if (read_tree[r] < 0 || covered(o.read[r])) continue;
        mkdirs(o.read[r]);
        attach(read_tree[r], o.read[r]);
        read_tree[r] = -1;
    }
    for (int c = 0; c < o.ncover; c++) {
        if (o.fs && under(o.cover[c], "/tmp")) mkdirs(o.cover[c]);
        struct stat st;
        if (stat(o.cover[c], &st) != 0) die(FAILED, "cannot restrict the command: --cover", o.cover[c]);
        if (!S_ISDIR(st.st_mode)) {
            errno = ENOTDIR;
            die(FAILED, "cannot restrict the command: --cover", o.cover[c]);
        }
        mount_tmpfs(o.cover[c], "mode=0755,size=64k,nr_inodes=4096", MS_NOEXEC);
    }
    for (int r = 0; r < o.nread; r++) {
        if (read_tree[r] < 0) continue;
        mkdirs(o.read[r]); /* its place in the cover */
        attach(read_tree[r], o.read[r]);
    }
    for (int w = 0; w < o.nwrite; w++) {
        if (write_tree[w] < 0 || strcmp(o.write[w], "/") == 0) continue;
        if (under(o.write[w], "/tmp") || covered(o.write[w])) mkdirs(o.write[w]); /* its place in the fresh /tmp or a cover */
        attach(write_tree[w], o.write[w]);
    }
    for (int c = 0; c < o.ncover; c++)
        if (setattr(AT_FDCWD, o.cover[c], 0, MOUNT_ATTR_RDONLY_ | MOUNT_ATTR_NOSUID_ | MOUNT_ATTR_NODEV_ | MOUNT_ATTR_NOEXEC_) != 0)
            die(FAILED, "cannot restrict the command: mount_setattr(--cover)", o.cover[c]);
    if (o.nhide) {
        int mask = make_mask();
        for (int h = 0; h < o.nhide; h++) hide(mask, o.hide[h]);
        close(mask);
    }
}

#define SYS_clone3_ 435
#define CLONE_PIDFD_ 0x1000ULL
#define CLONE_INTO_CGROUP_ 0x200000000ULL

struct clone_args_ {
    uint64_t flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls, set_tid, set_tid_size, cgroup;
};

/* The calling process joins the cgroup directory `cell`. A v1 cell by its `tasks` file: "0" there
 * moves this thread alone, which the kernel does without the cgroup_threadgroup_rwsem a move by
 * `cgroup.procs` takes for writing (and that, after an idle moment and without `favordynmods`,
 * waits for an RCU grace period, 6-17 ms here, with cgroup_mutex held: a zygote init's next
 * clone3 into a cell waited with it). Only for a process of one thread (a fork of ours, before it
 * starts any), where the thread is the process. A v2 cell has no `tasks`: its `cgroup.procs`.
 * Where a hierarchy will not take it, it goes on without (as the service's own step would). */
static void join_cell(int cell) {
    int procs = openat(cell, "tasks", O_WRONLY | O_CLOEXEC);
    if (procs < 0) procs = openat(cell, "cgroup.procs", O_WRONLY | O_CLOEXEC);
    if (procs >= 0 && write(procs, "0", 1) != 1) {}
    if (procs >= 0) close(procs);
}

/* The init's namespaces, made by the clone that starts it: the monitor stays in the host's, so its
 * own exit is cheap (the last one out of a mount namespace pays an RCU grace period to tear it
 * down, and that is the init, whose end nobody waits for). With --cgroup-fd the init is born in
 * that cgroup v2 directory (clone3's CLONE_INTO_CGROUP), so is everything it starts, and the
 * service need not move itself in for the spawn: a move of a whole process waits for an RCU grace
 * period after an idle moment (without `favordynmods`), a birth into the cell does not. Where
 * clone3 will not (an older kernel), the init joins it itself before anything runs. */
static pid_t start_init(int *ready) {
    int flags = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS | (o.net_on ? 0 : CLONE_NEWNET);
    int sync[2], join = 0;
    if (pipe2(sync, O_CLOEXEC) != 0) die(FAILED, "cannot start the command: pipe", "");
    pid_t child = -1;
    if (o.cgroup_fd >= 0) {
        struct clone_args_ ca;
        memset(&ca, 0, sizeof ca);
        ca.flags = (uint64_t)flags | CLONE_INTO_CGROUP_;
        ca.exit_signal = SIGCHLD;
        ca.cgroup = (uint64_t)o.cgroup_fd;
        child = (pid_t)syscall(SYS_clone3_, &ca, sizeof ca);
        join = child < 0;
    }
    /* fork() with namespace flags; the same argument order (flags, stack 0, ...) on every architecture */
    if (child < 0) child = (pid_t)syscall(SYS_clone, (unsigned long)flags | SIGCHLD, 0UL, 0UL, 0UL, 0UL);
    if (child < 0) die(FAILED, "cannot restrict the command: clone (user, mount, pid, ipc, uts, net namespaces)", "");
    if (child == 0) {
        if (join) join_cell(o.cgroup_fd);
        if (o.cgroup_fd >= 0) close(o.cgroup_fd);
        close(sync[1]);
        char go;
        if (read(sync[0], &go, 1) != 1) _exit(FAILED); /* the monitor failed to map our ids: it said why */
        close(sync[0]);
        *ready = 1;
        return 0;
    }
    close(sync[0]);
    /* The parent writes the child's maps: the service's uid and gid onto themselves. */
    char path[64], map[64];
    snprintf(path, sizeof path, "/proc/%d/setgroups", (int)child);
    write_file(path, "deny");
    snprintf(path, sizeof path, "/proc/%d/uid_map", (int)child);
    snprintf(map, sizeof map, "%u %u 1", (unsigned)getuid(), (unsigned)getuid());
    write_file(path, map);
    snprintf(path, sizeof path, "/proc/%d/gid_map", (int)child);
    snprintf(map, sizeof map, "%u %u 1", (unsigned)getgid(), (unsigned)getgid());
    write_file(path, map);
    if (write(sync[1], "x", 1) != 1) die(FAILED, "cannot start the command: sync", "");
    close(sync[1]);
    return child;
}

static void loopback_up(void) {
    struct ifreq ifr;
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    memset(&ifr, 0, sizeof ifr);
    strcpy(ifr.ifr_name, "lo");
    if (s < 0 || ioctl(s, SIOCGIFFLAGS, &ifr) != 0) die(FAILED, "cannot restrict the command: SIOCGIFFLAGS", "");
    ifr.ifr_flags |= IFF_UP;
    if (ioctl(s, SIOCSIFFLAGS, &ifr) != 0) die(FAILED, "cannot restrict the command: SIOCSIFFLAGS", "");
    close(s);
}

/* What no process of the sandbox gets back: securebits (needs CAP_SETPCAP; uid 0 gets no capability
 * back at exec, for good), the bounding set, the ambient set. Inherited by a fork: a zygote's init
 * drops them once for all its commands (its own effective set stays: it never execs). */
static void drop_capability_bounds(void) {
    if (prctl(PR_SET_SECUREBITS, 0x2f /* NOROOT, NO_SETUID_FIXUP and KEEP_CAPS, each locked */ | 0xc0 /* NO_CAP_AMBIENT_RAISE, locked */, 0, 0, 0) != 0)
        die(FAILED, "cannot restrict the command: PR_SET_SECUREBITS", "");
    /* Capabilities are numbered from 0 to the kernel's last: the first EINVAL is past it. */
    for (int cap = 0; cap < 64; cap++) {
        if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) == 0) continue;
        if (errno == EINVAL) break;
        die(FAILED, "cannot restrict the command: PR_CAPBSET_DROP", "");
    }
    if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0 && errno != EINVAL)
        die(FAILED, "cannot restrict the command: PR_CAP_AMBIENT_CLEAR_ALL", "");
}

/* The command's own capabilities (effective, permitted, inheritable): none. */
static void drop_capability_sets(void) {
    struct __user_cap_header_struct head = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[2];
    memset(data, 0, sizeof data);
    if (syscall(SYS_capset, &head, data) != 0) die(FAILED, "cannot restrict the command: capset", "");
}

/* Whether this process holds any capability (permitted): an unprivileged caller holds none, and
 * could not set securebits; uid 0 of the service's user namespace (--workspaces) may hold some. */
static int has_capabilities(void) {
    struct __user_cap_header_struct head = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[2];
    memset(data, 0, sizeof data);
    if (syscall(SYS_capget, &head, data) != 0) die(FAILED, "cannot restrict the command: capget", "");
    return data[0].permitted != 0 || data[1].permitted != 0;
}

/* --ruleset-out: one JSON line, {"policy", "abi", "handled_fs", "handled_net", "scoped",
 * "no_new_privs", "rules": [{"path", "access"}, ...]}, in one write (O_APPEND: lines of concurrent
 * commands do not mix). Paths are written as bytes, with quotes, backslashes and control characters
 * escaped. */
static char ruleset_text[1 << 16];
static size_t ruleset_len;

static void ruleset_put(const char *text, size_t n) {
    if (ruleset_len + n >= sizeof ruleset_text) {
        errno = E2BIG;
        die(FAILED, "cannot restrict the command: --ruleset-out", "");
    }
    memcpy(ruleset_text + ruleset_len, text, n);
    ruleset_len += n;
}

#define RULESET_PUT(literal) ruleset_put(literal, sizeof literal - 1)

static void ruleset_printf(const char *format, unsigned long long value) {
    char buf[64];
    int n = snprintf(buf, sizeof buf, format, value);
    ruleset_put(buf, (size_t)n);
}

static void ruleset_string(const char *text) {
    RULESET_PUT("\"");
    for (const unsigned char *p = (const unsigned char *)text; *p; p++) {
        if (*p == '"' || *p == '\\') {
            char esc[2] = {'\\', (char)*p};
            ruleset_put(esc, 2);
        } else if (*p < 0x20) {
            ruleset_printf("\\u%04llx", *p);
        } else {
            ruleset_put((const char *)p, 1);
        }
    }
    RULESET_PUT("\"");
}

static void write_ruleset(const char *policy, const struct ll_applied *a) {
    if (o.ruleset_fd < 0) return;
    ruleset_len = 0;
    RULESET_PUT("{\"policy\": ");
    ruleset_string(policy);
    ruleset_printf(", \"abi\": %llu", (unsigned long long)a->abi);
    ruleset_printf(", \"handled_fs\": %llu", a->handled_fs);
    ruleset_printf(", \"handled_net\": %llu", a->handled_net);
    ruleset_printf(", \"scoped\": %llu", a->scoped);
    ruleset_printf(", \"no_new_privs\": %llu", (unsigned long long)prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0));
    RULESET_PUT(", \"rules\": [");
    for (int r = 0; r < a->nrules; r++) {
        if (r) RULESET_PUT(", ");
        RULESET_PUT("{\"path\": ");
        ruleset_string(a->rules[r].path);
        ruleset_printf(", \"access\": %llu}", a->rules[r].access);
    }
    RULESET_PUT("]}\n");
    if (write(o.ruleset_fd, ruleset_text, ruleset_len) != (ssize_t)ruleset_len) die(FAILED, "cannot restrict the command: writing --ruleset-out", "");
    close(o.ruleset_fd);
    o.ruleset_fd = -1;
}

static void confine(enum ll_policy policy, const char *const *dirs, int ndirs) {
    struct ll_applied applied;
    const char *step = "", *what = "";
    if (ll_restrict(policy, o.fs, o.net_off, dirs, ndirs, policy == LL_READS ? o.argv[0] : NULL, &applied, &step, &what) != 0) {
        errno = errno ? errno : EPERM;
        die(FAILED, "cannot restrict the command:", *what ? what : step);
    }
    write_ruleset(policy == LL_READS ? "reads" : "command", &applied);
}

/* What is the same for every command, made by prepare_commands() and inherited by a fork: the signal
 * dispositions reset, the capability bounds dropped, the Landlock ruleset built (each command
 * applies it). The one-shot form makes it in its command's process; a zygote's init once, in its
 * mount view, for all its commands (the ruleset's paths resolve to the directories the view has
 * then: a writable directory replaced later is not writable to the zygote's commands; they fail
 * closed). */
static struct {
    int ready;
    int ruleset; /* its fd (close-on-exec: no program a command runs holds it), or LL_NONE */
    struct ll_applied applied;
} prepared = {0, LL_NONE};

static void prepare_commands(const char *failed) {
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    for (int sig = 1; sig < NSIG; sig++)
        if (sig != SIGKILL && sig != SIGSTOP) sigaction(sig, &dfl, NULL);
    drop_capability_bounds();
    /* writable: --write's, and the private /tmp and /dev/shm of the view */
    const char *writable[MAX_WRITE + 2], *step = "", *what = "";
    int nwritable = 0;
    for (int w = 0; w < o.nwrite; w++) writable[nwritable++] = o.write[w];
    if (o.fs) {
        writable[nwritable++] = "/tmp";
        writable[nwritable++] = "/dev/shm";
    }
    int ruleset = ll_build(LL_COMMAND, o.fs, o.net_off, writable, nwritable, NULL, &prepared.applied, &step, &what);
    if (ruleset == -1) {
        errno = errno ? errno : EPERM;
        die(FAILED, failed, *what ? what : step);
    }
    prepared.ruleset = ruleset;
    prepared.ready = 1;
}

static void set_rlimits(void) {
    if (o.file_size) {
        struct rlimit rl = {(rlim_t)o.file_size, (rlim_t)o.file_size};
        if (setrlimit(RLIMIT_FSIZE, &rl) != 0) die(FAILED, "cannot restrict the command: RLIMIT_FSIZE", "");
    }
    if (o.data_size) {
        struct rlimit rl = {(rlim_t)o.data_size, (rlim_t)o.data_size};
        if (setrlimit(RLIMIT_DATA, &rl) != 0) die(FAILED, "cannot restrict the command: RLIMIT_DATA", "");
    }
    /* The service raised its own soft limit for its connections (smith_fast/open_files.py): the
       command gets back the one the service was started with. Only the soft one is lowered, so the
       command may raise it again, as it could have. */
    struct rlimit files;
    if (o.open_files && getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur > (rlim_t)o.open_files) {
        files.rlim_cur = (rlim_t)o.open_files;
        if (setrlimit(RLIMIT_NOFILE, &files) != 0) die(FAILED, "cannot restrict the command: RLIMIT_NOFILE", "");
    }
}

/* In the command's process: everything that is per process, then exec (the one-shot form's command
 * and each of a zygote's). */
static void run_command(const char *cwd, char *const *argv, char *const *envp) {
    sigset_t none;
    if (!prepared.ready) prepare_commands("cannot restrict the command:");
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    if (setsid() < 0) die(FAILED, "cannot restrict the command: setsid", "");
    if (o.tty && ioctl(0, TIOCSCTTY, 0) != 0) die(FAILED, "cannot restrict the command: TIOCSCTTY", "");
    if (cwd[0] && chdir(cwd) != 0) die(FAILED, "cannot restrict the command: chdir", cwd);
    drop_capability_sets();
    const char *step = "", *what = "";
    if (ll_apply(prepared.ruleset, &step, &what) != 0) {
        errno = errno ? errno : EPERM;
        die(FAILED, "cannot restrict the command:", *what ? what : step);
    }
    write_ruleset("command", &prepared.applied);
    if (o.guard[1] >= 0 && unix_guard_install(o.guard[1], &step) != 0) die(FAILED, "cannot restrict the command:", step);
    set_rlimits();
    if (o.probe) _exit(0);
    /* The fds the service passed on (a Rust hook's answer pipe) stay; every fd of this program's
       own is close-on-exec or closed. */
    execve(argv[0], argv, envp);
    die(errno == ENOENT ? NOT_FOUND : FAILED, "cannot run", argv[0]);
}

/* The init's wait for its next signal; with the unix guard (--network allow) it answers the
 * command's connect() calls meanwhile (unix_guard.h), until no process holds the filter. */
static int next_signal(const sigset_t *all, siginfo_t *si, int *notify) {
    static int wake = -1;
    static const struct timespec now = {0, 0};
    if (*notify < 0) return sigwaitinfo(all, si);
    if (wake < 0 && (wake = signalfd(-1, all, SFD_CLOEXEC | SFD_NONBLOCK)) < 0) die(FAILED, "cannot supervise the command: signalfd", "");
    static const char *allowed[MAX_WRITE + 2];
    static int nallowed = -1;
    if (nallowed < 0) {
        nallowed = 0;
        for (int w = 0; w < o.nwrite; w++) allowed[nallowed++] = o.write[w];
        if (o.fs) {
            allowed[nallowed++] = "/tmp";
            allowed[nallowed++] = "/dev/shm";
        }
    }
    for (;;) {
        int sig = sigtimedwait(all, si, &now);
        if (sig > 0) return sig;
        struct pollfd p[2] = {{wake, POLLIN, 0}, {*notify, POLLIN, 0}};
        if (poll(p, 2, -1) < 0) continue;
        if (p[1].revents & POLLIN) {
            unix_guard_serve(*notify, allowed, nallowed);
        } else if (p[1].revents & (POLLHUP | POLLERR | POLLNVAL)) {
            close(*notify);
            *notify = -1;
            return sigwaitinfo(all, si);
        }
    }
}

/* What the init tells the monitor: the command's wait status and what it cost. */
struct report {
    int status;
    struct rusage usage;
};

/* pid 1: build the view, start the command, forward signals to it, reap, report. */
static void init(int report) {
    prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
    mount_view();
    if (o.egress_fd >= 0 && socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, o.guard) != 0)
        die(FAILED, "cannot restrict the command: socketpair", "");
    pid_t command = fork();
    if (command < 0) die(FAILED, "cannot start the command: fork", "");
    if (command == 0) {
        close(report);
        if (o.guard[0] >= 0) close(o.guard[0]);
        run_command(o.cwd, o.argv, o.envp != NULL ? o.envp : environ);
    }
    int notify = -1;
    if (o.guard[1] >= 0) {
        close(o.guard[1]);
        notify = unix_guard_receive(o.guard[0]);
    }
    sigset_t all;
    sigfillset(&all);
    for (;;) {
        siginfo_t si;
        int sig = next_signal(&all, &si, &notify);
        if (sig < 0) continue; /* EINTR */
        if (sig != SIGCHLD) {
            if (kill(-command, sig) != 0) kill(command, sig);
            continue;
        }
        int status;
        pid_t pid;
        while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
            if (pid != command) continue; /* an orphan, reaped */
            struct report r;
            memset(&r, 0, sizeof r);
            r.status = status;
            getrusage(RUSAGE_CHILDREN, &r.usage); /* the command and what it and the init reaped */
            if (write(report, &r, sizeof r) != sizeof r) _exit(FAILED);
            _exit(0);
        }
    }
}

/* --zygote CONTROL_FD: the init (pid 1 of a session's namespaces, its view built once) serves the
 * session's commands instead of one: each request on the SOCK_SEQPACKET socket CONTROL_FD forks a
 * command that does what the one-shot form's does (run_command: its session, capabilities dropped,
 * Landlock, rlimits, exec), so a command pays a fork and an exec, not namespaces and a mount view.
 *
 *   request (service -> init): struct zy_head, then cwd, the argv strings and the env strings, each
 *     NUL-terminated; with op 'S' (start) three fds (stdin, stdout, stderr) and then the command's
 *     cgroup directories (SCM_RIGHTS): it is born in the first with clone3(CLONE_INTO_CGROUP), so it
 *     cannot fork out before it is in; it joins the others (v1 hierarchies) itself before exec.
 *     Op 'R' (id: the next command's; fds: its cgroup directories) makes that command's process
 *     ahead (zy_prepare): born in those cells, their joins done, waiting for the request on a socket
 *     of its own, whose other end the reply 'Q' hands the service (with its pidfd). With strings
 *     (cwd, argv, env, as 'S') and three stdio fds before the cells (more with flags ZY_EXTRA), the
 *     process runs that argv at once (a shell, warm: it waits for its script on stdin) and the
 *     'Q' carries its pidfd alone.
 *     Op 'K' signals the process group of command id (the init owns the pids: a signal never reaches
 *     a reused one); op 'C' closes the zygote (so does EOF: the service's end closed or the service died).
 *     Ops 'S' and 'R' may carry the command's cell's usage files (flags' ZY_STATS bits say which,
 *     in that order) right after the stdio fds: the init reads them at the command's end (zy_stats).
 *   reply (init -> service): struct zy_reply; 'P' started (its pidfd attached, for the host's pid),
 *     'Q' made ahead (its pidfd and the service's end of its socket attached),
 *     'F' not started (value: errno), 'X' ended (value: wait status, usage: its wait4 rusage,
 *     stats: what its cell's usage files said once it was reaped, -1 for each not read).
 * When the init exits, the kernel kills whatever is left in the pid namespace. */
#define ZY_MAX_MSG (256 * 1024)
#define ZY_MAX_FDS 16
#define ZY_MAX_LIVE 4096

struct zy_head {
    uint32_t op, id;
    int32_t sig;
    uint32_t flags;
    uint64_t data_size;
    uint32_t argc, envc;
};

/* A request's usage files (flags, in this order after its stdio fds), and the reply's stats. */
#define ZY_EVENTS 0x10u      /* v2 cgroup.events: stats[0], populated */
#define ZY_CPU 0x20u         /* v2 cpu.stat: stats[1] and [2], user_usec and system_usec */
#define ZY_MEMORY 0x40u      /* v1 memory.max_usage_in_bytes or v2 memory.peak: stats[3] */
#define ZY_PIDS 0x80u        /* pids.peak: stats[4] */
#define ZY_STATS (ZY_EVENTS | ZY_CPU | ZY_MEMORY | ZY_PIDS)
#define ZY_NSTATS 5

struct zy_reply {
    uint32_t op, id;
    int32_t pid, value;
    struct rusage usage;
    int64_t stats[ZY_NSTATS];
};

/* A live command: its id, its pid, (held: -1 when none) the init's copies of its stdout and
 * stderr, closed only as its 'X' goes out, just before it, and its cell's usage files (stats:
 * which; zy_stats reads them for the 'X'). The service then finds the pipes' end and the 'X' ready
 * in one wake: the pipes, closed by the command's exit, woke it for their end, and the 'X' (after
 * the init's own wake for SIGCHLD, and the reap) woke it again. At most ZY_MAX_HELD commands hold
 * theirs (the init's fd limit: a session's long-running commands); the others' pipes close at
 * their start and their usage files at once, as before (the service reads those itself). */
#define ZY_MAX_HELD 128
static struct { uint32_t id; pid_t pid; int held[2]; uint32_t stats; int stat_fds[4]; } zy_live[ZY_MAX_LIVE];
static int zy_nlive, zy_nheld;

/* The number of usage files a request's flags name. */
static int zy_nstat(uint32_t flags) {
    return __builtin_popcount(flags & ZY_STATS);
}

/* Command id's process pid, reported by zy_reap when it ends; out and err (or NULL), and the
 * usage files flags name (stat_fds), the init keeps until then (taken: set to -1 in the caller's
 * array, which no longer closes them). Past ZY_MAX_HELD held commands, none is kept: the pipes
 * end at the command's exit, and the service reads the usage files itself (all stats -1). */
static void zy_track(uint32_t id, pid_t pid, int *out, int *err, uint32_t flags, int *stat_fds) {
    zy_live[zy_nlive].id = id;
    zy_live[zy_nlive].pid = pid;
    zy_live[zy_nlive].held[0] = zy_live[zy_nlive].held[1] = -1;
    zy_live[zy_nlive].stats = 0;
    if (((out != NULL && err != NULL) || zy_nstat(flags) > 0) && zy_nheld < ZY_MAX_HELD) {
        if (out != NULL && err != NULL) {
            zy_live[zy_nlive].held[0] = *out;
            zy_live[zy_nlive].held[1] = *err;
            *out = *err = -1;
        }
        zy_live[zy_nlive].stats = flags & ZY_STATS;
        for (int k = 0; k < zy_nstat(flags); k++) {
            zy_live[zy_nlive].stat_fds[k] = stat_fds[k];
            stat_fds[k] = -1;
        }
        zy_nheld++;
    }
    zy_nlive++;
}

/* The number after "KEY " at a line's start in text (cgroup.events, cpu.stat), or -1. */
static int64_t zy_field(const char *text, const char *key) {
    size_t n = strlen(key);
    for (const char *at = text; at != NULL; at = strchr(at, '\n')) {
        if (*at == '\n') at++;
        if (strncmp(at, key, n) == 0 && at[n] == ' ' && at[n + 1] >= '0' && at[n + 1] <= '9') return strtoll(at + n + 1, NULL, 10);
    }
    return -1;
}

/* The text of a cgroup file read afresh (a pread at 0), NUL-terminated; 0, or -1 when unread. */
static int zy_text(int fd, char *buf, size_t cap) {
    ssize_t n = pread(fd, buf, cap - 1, 0);
    if (n < 0) return -1;
    buf[n] = '\0';
    return 0;
}

/* What a command's cell's usage files say once it was reaped (its processes' exits counted; what
 * it left running, out of its group, may still add), into stats (-1: not read); then the files are
 * closed. The service reads them itself otherwise: these are the same reads, moved out of its loop
 * (the preads and their parsing: a tenth of its CPU per short command). Only read: a file the
 * service resets for the cell's next command (the v1 memory peak) it resets itself, once it knows
 * the cell is used again (an ended ready process's read must not reset a command's peak). */
static void zy_stats(uint32_t flags, const int *fds, int64_t *stats) {
    char buf[1024];
    int at = 0;
    for (int s = 0; s < ZY_NSTATS; s++) stats[s] = -1;
    if (flags & ZY_EVENTS) {
        if (zy_text(fds[at], buf, sizeof buf) == 0) stats[0] = zy_field(buf, "populated");
        close(fds[at++]);
    }
    if (flags & ZY_CPU) {
        if (zy_text(fds[at], buf, sizeof buf) == 0) {
            stats[1] = zy_field(buf, "user_usec");
            stats[2] = zy_field(buf, "system_usec");
        }
        close(fds[at++]);
    }
    if (flags & ZY_MEMORY) {
        if (zy_text(fds[at], buf, sizeof buf) == 0 && buf[0] >= '0' && buf[0] <= '9') stats[3] = strtoll(buf, NULL, 10);
        close(fds[at++]);
    }
    if (flags & ZY_PIDS) {
        if (zy_text(fds[at], buf, sizeof buf) == 0 && buf[0] >= '0' && buf[0] <= '9') stats[4] = strtoll(buf, NULL, 10);
        close(fds[at++]);
    }
}

static void zy_send_fds(int control, const struct zy_reply *r, const int *fds, int nfds) {
    if (send_with_fds(control, r, sizeof *r, fds, nfds, 0) < 0) _exit(0); /* the service is gone: so is the session */
}

static void zy_send(int control, const struct zy_reply *r, int fd) {
    zy_send_fds(control, r, &fd, fd >= 0);
}

/* The strings of a request: NUL-terminated, count of them, or -1 when the message is short. */
static int zy_strings(char **at, char *end, char **out, uint32_t count) {
    for (uint32_t k = 0; k < count; k++) {
        char *nul = memchr(*at, '\0', (size_t)(end - *at));
        if (nul == NULL) return -1;
        out[k] = *at;
        *at = nul + 1;
    }
    out[count] = NULL;
    return 0;
}

/* The process made ahead of the session's next command (op 'R', its id the command's): born in
 * that command's cell, its v1 cells joined, waiting on a socket of its own whose other end goes to
 * the service (reply 'Q'), which sends it the command directly: no step through the init. The
 * fork and the joins (zy_clone) are the init's dearest steps: they are paid here, between
 * commands, not while the peer waits. It is a live command to the init from its birth: 'K'
 * reaches it, and its end is an 'X' like any. */
static char zy_buf[ZY_MAX_MSG + 1];

/* A child born in cgroup directory cells[0] (clone3's CLONE_INTO_CGROUP) that has joined the others
 * (v1 hierarchies) itself, with a pidfd; in the child, the cells' fds are closed. Without clone3's
 * cgroup (an older kernel, a cell it may not enter that way) it joins every cell itself: still
 * before it can run anything. As the service's own step into a cell: where a hierarchy will not
 * take it, it goes on without (the service cannot do better: it needs the same permission). */
static pid_t zy_clone(const int *cells, int ncells, int *pidfd) {
    int joins = 0;
    struct clone_args_ ca;
    memset(&ca, 0, sizeof ca);
    ca.flags = CLONE_PIDFD_ | (ncells > 0 ? CLONE_INTO_CGROUP_ : 0);
    ca.pidfd = (uint64_t)(uintptr_t)pidfd;
    ca.exit_signal = SIGCHLD;
    ca.cgroup = ncells > 0 ? (uint64_t)cells[0] : 0;
    pid_t pid = (pid_t)syscall(SYS_clone3_, &ca, sizeof ca);
    if (pid < 0 && ncells > 0) {
        ca.flags = CLONE_PIDFD_;
        ca.cgroup = 0;
        joins = 1;
        pid = (pid_t)syscall(SYS_clone3_, &ca, sizeof ca);
    }
    if (pid < 0 && errno == ENOSYS) {
        joins = ncells > 0;
        pid = fork();
    }
    if (pid == 0) {
        /* Not its own: the other commands' pipes and usage files the init holds (zy_track). A
           process made ahead waits a while before its exec (which would close them): meanwhile a
           pipe of another command would not end when that command does. */
        for (int k = 0; k < zy_nlive; k++) {
            for (int e = 0; e < 2; e++)
                if (zy_live[k].held[e] >= 0) close(zy_live[k].held[e]);
            for (int f = 0; f < zy_nstat(zy_live[k].stats); f++) close(zy_live[k].stat_fds[f]);
        }
        for (int k = joins ? 0 : 1; k < ncells; k++) join_cell(cells[k]); /* one thread: the init's fork */
        for (int k = 0; k < ncells; k++)
            if (cells[k] > 2) close(cells[k]);
    }
    return pid;
}

/* A request's strings: cwd, argv, envp (calloc'd arrays pointing into the message). */
static int zy_parse(const struct zy_head *h, char *body, char *end, char **cwd, char ***argv, char ***envp) {
    *argv = *envp = NULL;
    *cwd = body;
    char *at = memchr(body, '\0', (size_t)(end - body));
    if (at == NULL || h->argc < 1 || h->argc > ZY_MAX_MSG || h->envc > ZY_MAX_MSG) return EINVAL;
    at++;
    *argv = calloc((size_t)h->argc + 1, sizeof **argv);
    *envp = calloc((size_t)h->envc + 1, sizeof **envp);
    if (*argv == NULL || *envp == NULL) return ENOMEM;
    if (zy_strings(&at, end, *argv, h->argc) != 0 || zy_strings(&at, end, *envp, h->envc) != 0) return EINVAL;
    return 0;
}

/* A request's stdio fds: 0, 1 and 2, then as many more (flags & ZY_EXTRA: at most 3), its fds 3
 * and up: a warm shell's, whose own stdin is its script, gets its command's stdin as fd 3. */
#define ZY_EXTRA 3u
static int zy_nstdio(const struct zy_head *h) {
    return 3 + (int)(h->flags & ZY_EXTRA);
}

/* In a command's process: stdio in place, then what the one-shot form's command does. */
static void zy_run(const struct zy_head *h, const int *stdio, const char *cwd, char **argv, char **envp) {
    int n = zy_nstdio(h);
    /* Its fds 3 and up are the command's: what the rest of its start uses moves above them (the
       stdio fds came after the init's own, so none of them is below its target). */
    int *used[] = {&prepared.ruleset, &o.ruleset_fd};
    for (size_t u = 0; u < sizeof used / sizeof *used; u++)
        if (*used[u] >= 3 && *used[u] < n && (*used[u] = fcntl(*used[u], F_DUPFD_CLOEXEC, n)) < 0)
            die(FAILED, "cannot start the command: fcntl", "");
    for (int k = 0; k < n; k++)
        if (dup2(stdio[k], k) < 0) die(FAILED, "cannot start the command: dup2", "");
    for (int k = 0; k < n; k++)
        if (stdio[k] >= n) close(stdio[k]);
    o.data_size = h->data_size;
    run_command(cwd, argv, envp);
}

/* The ready process: wait for its command (a request as the init takes one, with the three stdio
 * fds, from the service), then run it; the service's end closed (a discard): exit. */
static void zy_await(int sock) {
    int stdio[3], nfds, cut;
    struct zy_head h;
    ssize_t n = recv_with_fds(sock, zy_buf, ZY_MAX_MSG, stdio, 3, &nfds, &cut);
    if (n < (ssize_t)sizeof h || nfds != 3 || cut) _exit(FAILED);
    close(sock);
    memcpy(&h, zy_buf, sizeof h);
    h.flags &= ~ZY_EXTRA; /* three fds came */
    char *cwd, **argv, **envp;
    if (zy_parse(&h, zy_buf + sizeof h, zy_buf + n, &cwd, &argv, &envp) != 0) _exit(FAILED); /* never from the service */
    zy_run(&h, stdio, cwd, argv, envp);
}

/* Op 'R': the ready process of command h->id, born in cells (fds); its pidfd and the service's end
 * of its socket go back in a 'Q' ('F' with errno: none was made). */
static void zy_prepare(int control, const struct zy_head *h, int *fds, int nfds) {
    int nstat = zy_nstat(h->flags);
    int *cells = fds + nstat, ncells = nfds - nstat;
    struct zy_reply r;
    memset(&r, 0, sizeof r);
    r.op = 'F';
    r.id = h->id;
    int pair[2], pidfd = -1;
    if (zy_nlive >= ZY_MAX_LIVE || ncells < 0) {
        r.value = ncells < 0 ? EINVAL : EAGAIN;
        zy_send(control, &r, -1);
        return;
    }
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) != 0) {
        r.value = errno;
        zy_send(control, &r, -1);
        return;
    }
    pid_t pid = zy_clone(cells, ncells, &pidfd);
    if (pid == 0) {
        close(pair[0]);
        close(control);
        zy_await(pair[1]);
    }
    close(pair[1]);
    if (pid < 0) {
        r.value = errno;
        close(pair[0]);
        zy_send(control, &r, -1);
        return;
    }
    zy_track(h->id, pid, NULL, NULL, h->flags, fds);
    r.op = 'Q';
    r.pid = pid;
    int sent[2] = {pidfd, pair[0]};
    zy_send_fds(control, &r, sent, 2);
    close(pidfd);
    close(pair[0]);
}

/* Op 'S' (reply op 'P'), or 'R' with a command (a warm shell, started now: op 'Q'): the command
 * forked into its cells (the fds after its zy_nstdio stdio fds) and run with those stdio fds; the
 * reply carries its pidfd. */
static void zy_start(int control, const struct zy_head *h, char *buf, size_t n, int *fds, int nfds, char op) {
    struct zy_reply r;
    memset(&r, 0, sizeof r);
    r.op = 'F';
    r.id = h->id;
    char *cwd, **argv = NULL, **envp = NULL;
    int pidfd = -1;
    pid_t pid;
    int first = zy_nstdio(h) + zy_nstat(h->flags); /* its cells' fds: after the stdio and the usage files */
    if (nfds < first) {
        r.value = EINVAL;
        goto done;
    }
    if (zy_nlive >= ZY_MAX_LIVE) {
        r.value = EAGAIN;
        goto done;
    }
    if ((r.value = zy_parse(h, buf + sizeof *h, buf + n, &cwd, &argv, &envp)) != 0) goto done;
    pid = zy_clone(fds + first, nfds - first, &pidfd);
    if (pid < 0) {
        r.value = errno;
        goto done;
    }
    if (pid == 0) zy_run(h, fds, cwd, argv, envp);
    zy_track(h->id, pid, &fds[1], &fds[2], h->flags, fds + zy_nstdio(h));
    r.op = (uint32_t)op;
    r.pid = pid;
    free(argv);
    free(envp);
    zy_send(control, &r, pidfd);
    if (pidfd >= 0) close(pidfd);
    return;
done:
    free(argv);
    free(envp);
    zy_send(control, &r, -1);
}

static void zy_reap(int control) {
    int status;
    struct rusage usage;
    siginfo_t si;
    for (;;) {
        /* Looked at before the reap: while the shell is a zombie its group id is still its own, so
           what it left in its group (`cmd &`) is killed here, as the one-shot form's service does. */
        memset(&si, 0, sizeof si);
        if (waitid(P_ALL, 0, &si, WEXITED | WNOHANG | WNOWAIT) != 0 || si.si_pid == 0) return;
        pid_t pid = si.si_pid;
        int ours = 0;
        for (int k = 0; k < zy_nlive; k++) ours |= zy_live[k].pid == pid;
        if (ours) kill(-pid, SIGKILL);
        if (wait4(pid, &status, 0, &usage) != pid) return;
        for (int k = 0; k < zy_nlive; k++) {
            if (zy_live[k].pid != pid) continue;
            struct zy_reply r;
            memset(&r, 0, sizeof r);
            r.op = 'X';
            r.id = zy_live[k].id;
            r.pid = pid;
            r.value = status;
            r.usage = usage;
            zy_stats(zy_live[k].stats, zy_live[k].stat_fds, r.stats);
            if (zy_live[k].held[0] >= 0) { /* closed first: the 'X' finds the pipes' end there */
                close(zy_live[k].held[0]);
                close(zy_live[k].held[1]);
            }
            if (zy_live[k].held[0] >= 0 || zy_live[k].stats) zy_nheld--; /* what zy_track counted */
            zy_live[k] = zy_live[--zy_nlive];
            zy_send(control, &r, -1);
            break;
        } /* else an orphan, reaped */
    }
}

static void zy_signal(const struct zy_head *h) {
    for (int k = 0; k < zy_nlive; k++) {
        if (zy_live[k].id != h->id) continue;
        if (kill(-zy_live[k].pid, h->sig) != 0) kill(zy_live[k].pid, h->sig);
        return;
    }
}

/* pid 1 of a zygote: build the view once, then start commands until the service says stop. */
static void zygote(int control) {
    prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
    fcntl(control, F_SETFD, FD_CLOEXEC);
    mount_view();
    prepare_commands("cannot start the zygote:");
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    int sfd = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
    if (sfd < 0) die(FAILED, "cannot start the zygote: signalfd", "");
    char *buf = zy_buf;
    for (;;) {
        struct pollfd p[2] = {{control, POLLIN, 0}, {sfd, POLLIN, 0}};
        if (poll(p, 2, -1) < 0) continue; /* EINTR */
        if (p[1].revents) {
            struct signalfd_siginfo si;
            while (read(sfd, &si, sizeof si) > 0) {}
            zy_reap(control);
        }
        if (!p[0].revents) continue;
        int fds[ZY_MAX_FDS], nfds, cut;
        ssize_t n = recv_with_fds(control, buf, ZY_MAX_MSG, fds, ZY_MAX_FDS, &nfds, &cut);
        if (n < 0 && errno == EAGAIN) continue;
        if (n <= 0) _exit(0); /* EOF: the session is over, and the kernel ends what it left */
        struct zy_head h;
        if ((size_t)n >= sizeof h && cut) {
            /* more than it takes: refused, so that nothing waits for an answer that never comes */
            memcpy(&h, buf, sizeof h);
            if (h.op == 'S' || h.op == 'R') {
                struct zy_reply r;
                memset(&r, 0, sizeof r);
                r.op = 'F';
                r.id = h.id;
                r.value = EMSGSIZE;
                zy_send(control, &r, -1);
            }
        } else if ((size_t)n >= sizeof h) {
            memcpy(&h, buf, sizeof h);
            if (h.op == 'C') _exit(0);
            if (h.op == 'S') zy_start(control, &h, buf, (size_t)n, fds, nfds, 'P');
            else if (h.op == 'R' && h.argc > 0) zy_start(control, &h, buf, (size_t)n, fds, nfds, 'Q');
            else if (h.op == 'R') zy_prepare(control, &h, fds, nfds);
            else if (h.op == 'K') zy_signal(&h);
        }
        for (int k = 0; k < nfds; k++) close(fds[k]);
    }
}

/* The service's child: ends the way the command ended. */
static void monitor(pid_t child, int report) {
    int status = 0;
    struct report reported;
    ssize_t n;
    /* The init reports the command's status just before it exits; its exit then kills what is
       left in the namespace and tears the namespaces down (an RCU grace period or two: milliseconds
       on a busy machine). Only with --reap does the monitor wait for that; otherwise it ends at
       once and the init is reaped by whoever adopts it (the host's init, a subreaper). */
    while ((n = read(report, &reported, sizeof reported)) < 0 && errno == EINTR) {}
    if (n == (ssize_t)sizeof reported && !o.reap) {
        status = reported.status;
    } else {
        while (waitpid(child, &status, 0) < 0 && errno == EINTR) {}
        if (n == (ssize_t)sizeof reported) status = reported.status;
    }
    /* The service's wait4() sees this process only: the command's rusage goes to --usage-fd. */
    if (n == (ssize_t)sizeof reported && o.usage_fd > 2 && write(o.usage_fd, &reported.usage, sizeof reported.usage) < 0) {}
    if (WIFEXITED(status)) _exit(WEXITSTATUS(status));
    int sig = WIFSIGNALED(status) ? WTERMSIG(status) : SIGKILL;
    struct rlimit none = {0, 0};
    setrlimit(RLIMIT_CORE, &none);
    signal(sig, SIG_DFL);
    sigset_t one;
    sigemptyset(&one);
    sigaddset(&one, sig);
    kill(getpid(), sig);
    sigprocmask(SIG_UNBLOCK, &one, NULL);
    _exit(128 + sig);
}

static unsigned long long parse_size(const char *text, int *ok) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    *ok = errno == 0 && end != text && *end == '\0' && text[0] != '-';
    return v;
}

static void usage(const char *at) {
    fprintf(stderr,
            "smith-fast sandbox: usage: sandbox-exec [--write DIR]... [--read DIR]... [--hide PATH]... [--cover DIR]... [--fs on|off] "
            "[--network on|off|loopback|allow] [--egress-fd FD] [--tmp-size BYTES] [--file-size BYTES] [--data-size BYTES] [--open-files N] [--usage-fd FD] [--tty] [--cgroup-fd FD] [--reap] [--env-prefixed] [--probe] "
            "[--ruleset-out FILE] -- PROGRAM ARG..., or sandbox-exec --only-read DIR... [--file-size BYTES] [--data-size BYTES] [--probe] "
            "[--ruleset-out FILE] -- PROGRAM ARG..., or sandbox-exec --zygote FD [the first form's options] (at %s)\n", at ? at : "the end");
    _exit(2);
}

#define ENV_PREFIX "SMITH_FAST_ENV_"

/* --env-prefixed: the command's environment out of this program's (strings shared, not copied). */
static char **command_env(void) {
    size_t n = 0, k = 0, len = strlen(ENV_PREFIX);
    for (char **e = environ; *e; e++) n++;
    char **out = calloc(n + 1, sizeof *out);
    if (out == NULL) die(FAILED, "cannot start the command: out of memory", "");
    for (char **e = environ; *e; e++)
        if (strncmp(*e, ENV_PREFIX, len) == 0 && strchr(*e + len, '=') > *e + len) out[k++] = *e + len;
    return out;
}

int main(int argc, char **argv) {
    const char *network = "on";
    int i = 1, ok = 1;
    o.fs = 1;
    o.tmp_size = 1ULL << 30;
    o.ruleset_fd = -1;
    o.zygote_fd = -1;
    o.cgroup_fd = -1;
    o.egress_fd = o.guard[0] = o.guard[1] = -1;
    o.hide = calloc((size_t)argc, sizeof *o.hide);
    if (o.hide == NULL) die(FAILED, "cannot restrict the command: out of memory", "");
    for (; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--") == 0) { i++; break; }
        if (strcmp(a, "--probe") == 0) { o.probe = 1; continue; }
        if (strcmp(a, "--tty") == 0) { o.tty = o.view = 1; continue; }
        if (strcmp(a, "--reap") == 0) { o.reap = o.view = 1; continue; }
        if (strcmp(a, "--env-prefixed") == 0) { o.envp = command_env(); o.view = 1; continue; }
        if (i + 1 >= argc) usage(a);
        const char *v = argv[++i];
        if (strcmp(a, "--only-read") == 0 && v[0] == '/' && o.nonly < MAX_WRITE) { o.only[o.nonly++] = v; continue; }
        if (strcmp(a, "--ruleset-out") == 0 && o.ruleset_fd < 0) {
            o.ruleset_fd = open(v, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
            if (o.ruleset_fd < 0) die(FAILED, "cannot open --ruleset-out", v);
            continue;
        }
        if (strcmp(a, "--file-size") == 0 && (o.file_size = parse_size(v, &ok), ok)) continue;
        if (strcmp(a, "--data-size") == 0 && (o.data_size = parse_size(v, &ok), ok)) continue;
        if (strcmp(a, "--open-files") == 0 && (o.open_files = parse_size(v, &ok), ok) && o.open_files) continue;
        o.view = 1;
        if (strcmp(a, "--write") == 0 && v[0] == '/' && o.nwrite < MAX_WRITE) o.write[o.nwrite++] = v;
        else if (strcmp(a, "--read") == 0 && v[0] == '/' && o.nread < MAX_WRITE) o.read[o.nread++] = v;
        else if (strcmp(a, "--hide") == 0 && v[0] == '/') o.hide[o.nhide++] = v;
        else if (strcmp(a, "--cover") == 0 && v[0] == '/' && strcmp(v, "/") != 0 && o.ncover < MAX_WRITE) o.cover[o.ncover++] = v;
        else if (strcmp(a, "--fs") == 0 && (!strcmp(v, "on") || !strcmp(v, "off"))) o.fs = strcmp(v, "on") == 0;
        else if (strcmp(a, "--network") == 0 && (!strcmp(v, "on") || !strcmp(v, "off") || !strcmp(v, "loopback") || !strcmp(v, "allow"))) network = v;
        else if (strcmp(a, "--egress-fd") == 0 && (o.egress_fd = (int)parse_size(v, &ok), ok && o.egress_fd > 2)) {}
        else if (strcmp(a, "--tmp-size") == 0 && (o.tmp_size = parse_size(v, &ok), ok && o.tmp_size > 0)) {}
        else if (strcmp(a, "--zygote") == 0 && (o.zygote_fd = (int)parse_size(v, &ok), ok && o.zygote_fd > 2)) {}
        else if (strcmp(a, "--usage-fd") == 0 && (o.usage_fd = (int)parse_size(v, &ok), ok && o.usage_fd > 2)) {}
        else if (strcmp(a, "--cgroup-fd") == 0 && (o.cgroup_fd = (int)parse_size(v, &ok), ok && o.cgroup_fd > 2)) {}
        else usage(a);
    }
    if (!o.probe && i >= argc && o.zygote_fd < 0) usage(NULL);
    if (o.zygote_fd >= 0 && (o.tty || o.usage_fd || o.egress_fd >= 0 || o.cgroup_fd >= 0 || i < argc))
        usage("--zygote with --tty, --usage-fd, --egress-fd, --cgroup-fd or a PROGRAM");
    if (o.cgroup_fd >= 0 && fcntl(o.cgroup_fd, F_SETFD, FD_CLOEXEC) != 0) usage("--cgroup-fd");
    if (o.nonly) {
        /* Landlock alone: PROGRAM, a path, is the one program the process may run. */
        if (o.view) usage("--only-read with an option of the namespaces' form");
        if (i >= argc || argv[i][0] != '/') usage("--only-read needs PROGRAM as an absolute path");
        o.argv = argv + i;
        if (has_capabilities()) {
            drop_capability_bounds();
            drop_capability_sets();
        }
        confine(LL_READS, o.only, o.nonly);
        set_rlimits();
        if (o.probe) _exit(0);
        execv(o.argv[0], o.argv);
        die(errno == ENOENT ? NOT_FOUND : FAILED, "cannot run", o.argv[0]);
    }
    for (int w = 0; w < o.nwrite; w++)
        if (under(o.write[w], "/proc") || under(o.write[w], "/dev") || under(o.write[w], "/sys"))
            usage(o.write[w]);
    for (int c = 0; c < o.ncover; c++)
        if (under(o.cover[c], "/proc") || under(o.cover[c], "/dev") || under(o.cover[c], "/sys") || under(o.cover[c], "/run"))
            usage(o.cover[c]);
    o.argv = argv + i;
    o.net_off = strcmp(network, "off") == 0;
    o.net_on = strcmp(network, "on") == 0;
    o.loopback = strcmp(network, "loopback") == 0 || strcmp(network, "allow") == 0;
    /* allow: loopback alone, plus the egress listener and the unix guard; one without the other is refused */
    if ((strcmp(network, "allow") == 0) != (o.egress_fd >= 0)) usage("--network allow goes with --egress-fd FD");
    if (getcwd(o.cwd, sizeof o.cwd) == NULL) o.cwd[0] = '\0';
    if (o.tty && ttyname_r(0, o.tty_name, sizeof o.tty_name) != 0) o.tty_name[0] = '\0';
    signal(SIGCHLD, SIG_DFL); /* an ignored SIGCHLD survives exec, and the init must see its children end */

    /* Every signal waits until the init forwards it: none may end the monitor or the init early. */
    sigset_t all, old;
    sigfillset(&all);
    sigprocmask(SIG_BLOCK, &all, &old);
    int report[2], is_init = 0;
    if (pipe2(report, O_CLOEXEC) != 0) die(FAILED, "cannot start the command: pipe", "");
    /* A zygote's monitor ends with the service (and its init with it, by its own death signal). */
    if (o.zygote_fd >= 0) prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
    pid_t child = start_init(&is_init);
    if (is_init) {
        close(report[0]);
        if (o.usage_fd > 2) close(o.usage_fd); /* the monitor's alone: nothing in the sandbox may write it */
        if (o.loopback) loopback_up();
        const char *step = "";
        if (o.egress_fd >= 0 && egress_send_listener(o.egress_fd, &step) != 0) die(FAILED, "cannot start the egress listener:", step);
        if (o.zygote_fd >= 0) zygote(o.zygote_fd);
        init(report[1]);
    }
    close(report[1]);
    if (o.egress_fd >= 0) close(o.egress_fd); /* the init's alone */
    if (o.cgroup_fd >= 0) close(o.cgroup_fd);
    if (o.zygote_fd >= 0) close(o.zygote_fd); /* the init's alone: its EOF is the service's end or death */
    monitor(child, report[0]);
    return FAILED;
}
