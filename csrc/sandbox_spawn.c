/* smith_fast._spawn_c: start a sandboxed command with its Landlock policy applied in the child
 * between clone and exec, instead of exec'ing the sandbox-exec wrapper first.
 *
 * An exec costs ~300 us on the machines measured (bench/bench_exec_start.py), as much as the rest
 * of a `true` command's start; the wrapper made every sandboxed command pay two. Running Python
 * between fork and exec is not safe in a threaded service (preexec_fn), so the child's work is
 * this C function, which, like _posixsubprocess's vfork path, touches no Python object, takes no
 * lock and calls no malloc: it runs on a stack of its own in a CLONE_VM|CLONE_VFORK child (the
 * caller is suspended until the exec, so no page tables are copied) and reports a failure through
 * the memory it shares with the caller.
 *
 * The child, in order: signal handlers back to their defaults and the caller's mask restored (as
 * subprocess's restore_signals), setsid, the three standard fds, chdir, joining the command's
 * cgroups (writing 0 to each cgroup.procs: it is born outside the cell but joins before anything
 * of the command runs, and the service never steps into the cell), the Landlock policy of
 * landlock_policy.h (the wrapper's, same source), closing every other fd, execve. Only for
 * --network on: a network namespace needs the wrapper (unshare in a single-threaded process).
 */
#define PY_SSIZE_T_CLEAN
#define _GNU_SOURCE
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "landlock_policy.h"

#define MAX_CGROUPS 16
#define CHILD_STACK (64 * 1024)

enum { ST_OK, ST_SETSID, ST_DUP, ST_CWD, ST_LANDLOCK, ST_EXEC };

struct child_args {
    const char *path;
    char *const *argv;
    char *const *envp;
    const char *cwd;
    int fds[3];
    const char *procs[MAX_CGROUPS];
    int nprocs;
    const char *const *readable;
    int nreadable;
    const char *const *writable;
    int nwritable;
    sigset_t oldmask;
    /* written by the child */
    int err;
    int stage;
    const char *step;
    const char *what;
    unsigned joined;
};

static char child_stack[CHILD_STACK] __attribute__((aligned(16)));

static int fail(struct child_args *a, int stage) {
    a->err = errno ? errno : EINVAL;
    a->stage = stage;
    _exit(127);
}

static int child(void *p) {
    struct child_args *a = p;
    /* what subprocess does in its vfork child (reset_signal_handlers + restore_signals): a handler
       of the service's must not run in the command, and the ignored SIGPIPE/SIGXFSZ of the
       interpreter must not reach it (`yes | head` ends quietly) */
    for (int sig = 1; sig < _NSIG; sig++) {
        struct sigaction sa;
        if (sig == SIGKILL || sig == SIGSTOP || sigaction(sig, NULL, &sa) != 0) continue;
        if (sa.sa_handler == SIG_DFL) continue;
        if (sa.sa_handler == SIG_IGN && sig != SIGPIPE && sig != SIGXFSZ) continue;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = SIG_DFL;
        sigaction(sig, &sa, NULL);
    }
    sigprocmask(SIG_SETMASK, &a->oldmask, NULL);
    if (setsid() < 0) return fail(a, ST_SETSID);
    for (int i = 0; i < 3; i++)
        if (dup2(a->fds[i], i) < 0) return fail(a, ST_DUP);
    if (a->cwd != NULL && chdir(a->cwd) != 0) return fail(a, ST_CWD);
    /* before Landlock, which would refuse the write */
    for (int i = 0; i < a->nprocs; i++) {
        int fd = open(a->procs[i], O_WRONLY | O_CLOEXEC);
        if (fd < 0) continue;
        if (write(fd, "0", 1) == 1) a->joined |= 1u << i;
        close(fd);
    }
    if (ll_restrict(1, 0, 1, a->readable, a->nreadable, a->writable, a->nwritable, &a->step, &a->what) != 0)
        return fail(a, ST_LANDLOCK);
    if (syscall(SYS_close_range, 3, ~0U, 0) != 0) {
        struct rlimit rl;
        long top = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY ? (long)rl.rlim_cur : 65536;
        for (long fd = 3; fd < top; fd++) close((int)fd);
    }
    execve(a->path, a->argv, a->envp);
    return fail(a, ST_EXEC);
}

/* A list of bytes as a NULL-terminated char* array borrowing the bytes' buffers. */
static const char **as_array(PyObject *list, const char *name, Py_ssize_t *count) {
    if (!PyList_Check(list)) {
        PyErr_Format(PyExc_TypeError, "%s must be a list of bytes", name);
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(list);
    const char **out = PyMem_Calloc((size_t)n + 1, sizeof *out);
    if (out == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(list, i);
        if (!PyBytes_Check(item)) {
            PyMem_Free(out);
            PyErr_Format(PyExc_TypeError, "%s must be a list of bytes", name);
            return NULL;
        }
        if ((Py_ssize_t)strlen(PyBytes_AS_STRING(item)) != PyBytes_GET_SIZE(item)) {
            PyMem_Free(out);
            PyErr_SetString(PyExc_ValueError, "embedded null byte");
            return NULL;
        }
        out[i] = PyBytes_AS_STRING(item);
    }
    if (count) *count = n;
    return out;
}

PyDoc_STRVAR(spawn_doc,
"spawn(path, argv, envp, cwd, fds, cgroup_procs, readable, writable) -> (pid, joined)\n\n"
"Start ``path`` with ``argv`` and ``envp`` (lists of bytes) in ``cwd`` (bytes or None), with\n"
"``fds`` (three fds, each >= 3) as its stdin, stdout and stderr, in a new session, after writing\n"
"0 to each of ``cgroup_procs`` and restricting itself with the sandbox's Landlock policy\n"
"(``--network on``: read beneath ``readable``, or everything when empty; write beneath\n"
"``writable``). Returns its pid and the bit mask of the cgroup files it joined.\n\n"
"Raises OSError (filename: ``cwd`` or ``path``) when a step failed; nothing of the command ran.");

static PyObject *spawn(PyObject *self, PyObject *args) {
    (void)self;
    const char *path;
    PyObject *argv_o, *envp_o, *cwd_o, *procs_o, *readable_o, *writable_o;
    int fds[3];
    if (!PyArg_ParseTuple(args, "yOOO(iii)OOO:spawn", &path, &argv_o, &envp_o, &cwd_o, &fds[0], &fds[1], &fds[2],
                          &procs_o, &readable_o, &writable_o))
        return NULL;
    for (int i = 0; i < 3; i++)
        if (fds[i] < 3) return PyErr_Format(PyExc_ValueError, "spawn: fd %d is below 3", fds[i]);
    if (cwd_o != Py_None && !PyBytes_Check(cwd_o)) return PyErr_Format(PyExc_TypeError, "cwd must be bytes or None");

    struct child_args a;
    memset(&a, 0, sizeof a);
    Py_ssize_t n_procs = 0, n_read = 0, n_write = 0;
    const char **argv = as_array(argv_o, "argv", NULL);
    const char **envp = argv ? as_array(envp_o, "envp", NULL) : NULL;
    const char **procs = envp ? as_array(procs_o, "cgroup_procs", &n_procs) : NULL;
    const char **readable = procs ? as_array(readable_o, "readable", &n_read) : NULL;
    const char **writable = readable ? as_array(writable_o, "writable", &n_write) : NULL;
    PyObject *result = NULL;
    if (writable == NULL) goto done;
    if (n_procs > MAX_CGROUPS || PyList_GET_SIZE(argv_o) < 1) {
        PyErr_SetString(PyExc_ValueError, "spawn: no argv, or too many cgroups");
        goto done;
    }
    a.path = path;
    a.argv = (char *const *)argv;
    a.envp = (char *const *)envp;
    a.cwd = cwd_o == Py_None ? NULL : PyBytes_AS_STRING(cwd_o);
    memcpy(a.fds, fds, sizeof fds);
    for (Py_ssize_t i = 0; i < n_procs; i++) a.procs[i] = procs[i];
    a.nprocs = (int)n_procs;
    a.readable = readable;
    a.nreadable = (int)n_read;
    a.writable = writable;
    a.nwritable = (int)n_write;
    a.step = a.what = "";

    /* The GIL stays held: it serializes the callers of the one child stack, and the child runs
       for the microseconds until its exec. Every signal is blocked meanwhile, so none of the
       service's handlers runs on the child's side of the shared memory. */
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &a.oldmask);
    pid_t pid = clone(child, child_stack + CHILD_STACK, CLONE_VM | CLONE_VFORK | SIGCHLD, &a);
    int saved = errno;
    pthread_sigmask(SIG_SETMASK, &a.oldmask, NULL);
    if (pid < 0) {
        errno = saved;
        PyErr_SetFromErrno(PyExc_OSError);
        goto done;
    }
    if (a.err != 0) {
        int status;
        while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
        errno = a.err;
        if (a.stage == ST_CWD && a.cwd != NULL) {
            PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, cwd_o);
        } else if (a.stage == ST_EXEC) {
            PyErr_SetFromErrnoWithFilename(PyExc_OSError, path);
        } else if (a.stage == ST_LANDLOCK) {
            PyErr_Format(PyExc_OSError, "cannot restrict the command: %s%s%s%s: %s", a.step, *a.what ? "(" : "",
                         a.what, *a.what ? ")" : "", strerror(a.err));
        } else {
            PyErr_SetFromErrno(PyExc_OSError);
        }
        goto done;
    }
    result = Py_BuildValue("(iI)", (int)pid, a.joined);
done:
    PyMem_Free(argv);
    PyMem_Free(envp);
    PyMem_Free(procs);
    PyMem_Free(readable);
    PyMem_Free(writable);
    return result;
}

static PyMethodDef methods[] = {
    {"spawn", spawn, METH_VARARGS, spawn_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_spawn_c",
    "Sandboxed spawn with Landlock applied between clone and exec (csrc/sandbox_spawn.c).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__spawn_c(void) { return PyModule_Create(&module); }
