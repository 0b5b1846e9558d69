/*
 * orchard-enter: start a command inside a local sandbox in one small exec.
 *
 *   orchard-enter [--user UID:GID] HOLDER_PID CWD N CGROUP_PROCS_1 .. CGROUP_PROCS_N -- ARGV...
 *   orchard-enter [--user UID:GID] HOLDER_PID CWD N CGROUP_PROCS... --serve FD
 *   orchard-enter --seccomp-bpf      (writes the sandbox's seccomp program to stdout)
 *   orchard-enter --stage DIR UID SOURCE_1 .. SOURCE_N -- BWRAP ARGV...
 *
 * Joins the N cgroups (writing its pid to each cgroup.procs file), drops its supplementary
 * groups, enters the holder's user namespace and then its ipc, uts, net, pid and mount
 * namespaces and its root. There it becomes the sandbox's root (uid 0 of that user
 * namespace: an unprivileged uid range on the host), keeps only the capabilities a normal
 * container needs (below; valid in the sandbox's user namespace only), sets
 * no_new_privs and loads the seccomp filter below. It then changes to CWD (a path inside
 * the sandbox), forks (a pid namespace applies to children only) and executes ARGV in the
 * child. It waits and exits as the child did: with its status, or killed by the same
 * signal. It stays in the caller's process group, so killing that group kills both.
 *
 * --stage starts a sandbox's holder: bwrap must run as the sandbox's unprivileged host uid,
 * which may not be allowed to walk to its sources (a state dir under a private home). In a
 * mount namespace of its own (private: nothing reaches the host's), it mounts a tmpfs on
 * DIR and binds each SOURCE (a host file or directory) there as DIR/0 .. DIR/N-1, then
 * drops its supplementary groups, becomes UID:UID and executes bwrap, which finds its
 * sources under DIR.
 *
 * A holder without a user namespace of its own (a sandbox made before they existed) is
 * refused: entering it would give the command the host's root.
 *
 * --user runs ARGV as that uid and gid of the sandbox (its image's User) instead of its
 * root: after the namespaces are joined it takes GID as its only group and becomes UID,
 * which drops every capability.
 *
 * The command's environment arrives with every name prefixed (ORCHARD_ENTER_ENV_PATH=...),
 * and the helper runs with nothing else: this program runs as host root before it enters
 * the sandbox, so neither the dynamic loader (LD_PRELOAD, LD_LIBRARY_PATH), nor glibc
 * (GLIBC_TUNABLES, MALLOC_*), nor anything else in it may act on what a tenant or an
 * image set. The prefixes are stripped only for the command's exec.
 *
 * --serve makes it the sandbox's command spawner: it enters the sandbox once, exactly as
 * above, then serves requests on FD (a SOCK_SEQPACKET unix socket from the agent) until
 * the agent closes its end. Each request is one message, a header and NUL-terminated
 * strings (CWD, ARGV, ENV), with the command's stdout, stderr and optionally stdin as
 * SCM_RIGHTS fds; the spawner forks, and the child takes those fds as 0, 1 and 2, starts
 * a session, changes to CWD and executes ARGV with ENV. A command therefore costs one
 * fork of this small process and one exec, instead of a fork of the agent, the exec of
 * this program, its namespace entry and a second exec. Replies are fixed-size records:
 * started (with the child's pid), exited (wait status and rusage) or failed (errno). A
 * kill request signals a command's process group, only while the spawner has not reaped
 * it (so its pid cannot have been reused). Everything it runs inherits the sandbox's
 * namespaces, cgroups, capabilities, no_new_privs and seccomp filter from it. It exits
 * when the agent's end closes, and is killed if the agent dies.
 *
 * Exit codes of its own: 125 (it could not enter the sandbox), 126 (ARGV[0] is not
 * executable), 127 (not found), each with a message on stderr.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/audit.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#if defined(__x86_64__)
#define NATIVE_ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define NATIVE_ARCH AUDIT_ARCH_AARCH64
#else
#error "orchard-enter knows the seccomp arch of x86_64 and aarch64 only"
#endif

static const struct {
    const char *name;
    int type;
} NAMESPACES[] = {
    /* user first: the others belong to it. mnt last: after it, /proc paths are the
     * sandbox's own view. */
    {"user", CLONE_NEWUSER}, {"ipc", CLONE_NEWIPC}, {"uts", CLONE_NEWUTS},
    {"net", CLONE_NEWNET},   {"pid", CLONE_NEWPID}, {"mnt", CLONE_NEWNS},
};
#define N_NAMESPACES (sizeof(NAMESPACES) / sizeof(NAMESPACES[0]))

/* Docker's default capability set less MKNOD, NET_RAW and AUDIT_WRITE (the Docker
 * backend's set too): what a normal dev container needs to install packages, chown and
 * bind low ports. All of them act in the sandbox's user namespace only. */
static const int KEPT_CAPS[] = {
    CAP_CHOWN,  CAP_DAC_OVERRIDE, CAP_FSETID,           CAP_FOWNER,     CAP_SETGID,
    CAP_SETUID, CAP_SETFCAP,      CAP_SETPCAP,          CAP_NET_BIND_SERVICE,
    CAP_SYS_CHROOT,               CAP_KILL,
};
#define N_KEPT (sizeof(KEPT_CAPS) / sizeof(KEPT_CAPS[0]))

/* Refused outright with EPERM, after Docker's default profile: mounts, the kernel keyring,
 * bpf, perf, modules, reboot/kexec, swap, clocks, namespaces, file handles (the classic
 * "shocker" escape), io_uring, raw port I/O and the kernel log. */
static const int DENIED[] = {
#ifdef __NR_mount
    __NR_mount,
#endif
#ifdef __NR_umount
    __NR_umount,
#endif
#ifdef __NR_umount2
    __NR_umount2,
#endif
#ifdef __NR_pivot_root
    __NR_pivot_root,
#endif
#ifdef __NR_move_mount
    __NR_move_mount,
#endif
#ifdef __NR_open_tree
    __NR_open_tree,
#endif
#ifdef __NR_fsopen
    __NR_fsopen,
#endif
#ifdef __NR_fsconfig
    __NR_fsconfig,
#endif
#ifdef __NR_fsmount
    __NR_fsmount,
#endif
#ifdef __NR_fspick
    __NR_fspick,
#endif
#ifdef __NR_mount_setattr
    __NR_mount_setattr,
#endif
#ifdef __NR_add_key
    __NR_add_key,
#endif
#ifdef __NR_request_key
    __NR_request_key,
#endif
#ifdef __NR_keyctl
    __NR_keyctl,
#endif
#ifdef __NR_bpf
    __NR_bpf,
#endif
#ifdef __NR_perf_event_open
    __NR_perf_event_open,
#endif
#ifdef __NR_init_module
    __NR_init_module,
#endif
#ifdef __NR_finit_module
    __NR_finit_module,
#endif
#ifdef __NR_delete_module
    __NR_delete_module,
#endif
#ifdef __NR_reboot
    __NR_reboot,
#endif
#ifdef __NR_kexec_load
    __NR_kexec_load,
#endif
#ifdef __NR_kexec_file_load
    __NR_kexec_file_load,
#endif
#ifdef __NR_swapon
    __NR_swapon,
#endif
#ifdef __NR_swapoff
    __NR_swapoff,
#endif
#ifdef __NR_acct
    __NR_acct,
#endif
#ifdef __NR_settimeofday
    __NR_settimeofday,
#endif
#ifdef __NR_clock_settime
    __NR_clock_settime,
#endif
#ifdef __NR_clock_adjtime
    __NR_clock_adjtime,
#endif
#ifdef __NR_adjtimex
    __NR_adjtimex,
#endif
#ifdef __NR_unshare
    __NR_unshare,
#endif
#ifdef __NR_setns
    __NR_setns,
#endif
#ifdef __NR_open_by_handle_at
    __NR_open_by_handle_at,
#endif
#ifdef __NR_name_to_handle_at
    __NR_name_to_handle_at,
#endif
#ifdef __NR_lookup_dcookie
    __NR_lookup_dcookie,
#endif
#ifdef __NR_quotactl
    __NR_quotactl,
#endif
#ifdef __NR_quotactl_fd
    __NR_quotactl_fd,
#endif
#ifdef __NR_nfsservctl
    __NR_nfsservctl,
#endif
#ifdef __NR_vhangup
    __NR_vhangup,
#endif
#ifdef __NR_iopl
    __NR_iopl,
#endif
#ifdef __NR_ioperm
    __NR_ioperm,
#endif
#ifdef __NR_syslog
    __NR_syslog,
#endif
#ifdef __NR_uselib
    __NR_uselib,
#endif
#ifdef __NR_userfaultfd
    __NR_userfaultfd,
#endif
#ifdef __NR_fanotify_init
    __NR_fanotify_init,
#endif
#ifdef __NR_io_uring_setup
    __NR_io_uring_setup,
#endif
#ifdef __NR_io_uring_enter
    __NR_io_uring_enter,
#endif
#ifdef __NR_io_uring_register
    __NR_io_uring_register,
#endif
};
#define N_DENIED (sizeof(DENIED) / sizeof(DENIED[0]))

/* clone() flags that make namespaces (CLONE_NEWTIME shares its bit with clone's exit
 * signal, so it is left to unshare, which is refused whole). */
#define NAMESPACE_FLAGS                                                                  \
    (CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID |          \
     CLONE_NEWNET | CLONE_NEWCGROUP)

#define MAX_FILTER 160
#define ARG_LOW(n) (offsetof(struct seccomp_data, args) + (n) * sizeof(uint64_t))

struct program {
    struct sock_filter ins[MAX_FILTER];
    unsigned short len;
};

static void emit(struct program *p, struct sock_filter f) {
    if (p->len >= MAX_FILTER) {
        fprintf(stderr, "orchard-enter: seccomp program too long\n");
        _exit(125);
    }
    p->ins[p->len++] = f;
}

/* A conditional jump to an absolute instruction index `target` when equal, else on. */
static void jump_if(struct program *p, uint32_t k, unsigned short target) {
    emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, k,
                                         (unsigned char)(target - p->len - 1), 0));
}

/* Arguments checked by the filter; the mode's file type of mknod(at) and clone's flags
 * are low 32 bits (little-endian: the first word of the 64-bit argument). */
static void build_filter(struct program *p) {
    /* Layout: [header][one jump per denied or inspected call][ALLOW][clone check]
     * [mknod check][mknodat check][DENY][ENOSYS][KILL]. The jumps are forward and
     * their targets are known once the sizes are: count first, then emit. */
    unsigned short header = 3, n_jumps = (unsigned short)N_DENIED + 4;
    unsigned short allow = header + n_jumps;
#ifdef __x86_64__
    allow += 1; /* the x32 check */
#endif
    unsigned short clone_check = allow + 1;          /* LD, JSET, RET ALLOW */
    unsigned short mknod_check = clone_check + 3;    /* LD, AND, JEQ, JEQ, RET ALLOW */
    unsigned short mknodat_check = mknod_check + 5;  /* LD, AND, JEQ, JEQ, RET ALLOW */
    unsigned short deny = mknodat_check + 5;
    unsigned short enosys = deny + 1, kill = deny + 2;

    p->len = 0;
    emit(p, (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS,
                                         offsetof(struct seccomp_data, arch)));
    emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, NATIVE_ARCH, 0,
                                         (unsigned char)(kill - 2)));
    emit(p, (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS,
                                         offsetof(struct seccomp_data, nr)));
#ifdef __x86_64__
    /* x32 system calls share the arch value but carry bit 30: refuse them all. */
    emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, 0x40000000,
                                         (unsigned char)(deny - p->len - 1), 0));
#endif
    for (size_t i = 0; i < N_DENIED; i++)
        jump_if(p, (uint32_t)DENIED[i], deny);
    jump_if(p, __NR_clone, clone_check);
#ifdef __NR_clone3
    jump_if(p, __NR_clone3, enosys); /* its flags live in memory: libc falls back to clone */
#else
    jump_if(p, (uint32_t)-1, enosys);
#endif
#ifdef __NR_mknod
    jump_if(p, __NR_mknod, mknod_check);
#else
    jump_if(p, (uint32_t)-1, mknod_check);
#endif
    jump_if(p, __NR_mknodat, mknodat_check);
    emit(p, (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW));

    /* clone: refused when it would make a namespace */
    emit(p, (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ARG_LOW(0)));
    emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, NAMESPACE_FLAGS,
                                         (unsigned char)(deny - p->len - 1), 0));
    emit(p, (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW));
    /* mknod(path, mode, dev) and mknodat(dirfd, path, mode, dev): no device nodes */
    for (int arg = 1; arg <= 2; arg++) {
        emit(p, (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ARG_LOW(arg)));
        emit(p, (struct sock_filter)BPF_STMT(BPF_ALU | BPF_AND | BPF_K, S_IFMT));
        jump_if(p, S_IFCHR, deny);
        jump_if(p, S_IFBLK, deny);
        emit(p, (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW));
    }
    emit(p, (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM));
    emit(p, (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS));
    /* another arch's calls (32-bit int 0x80 on x86_64) would bypass the numbers above */
    emit(p, (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS));
    if (p->len != kill + 1) {
        fprintf(stderr, "orchard-enter: seccomp layout mismatch (%u != %u)\n", p->len,
                kill + 1);
        _exit(125);
    }
}

static void die(const char *what, const char *arg) {
    fprintf(stderr, "orchard: %s %s: %s\n", what, arg, strerror(errno));
    _exit(125);
}

static int open_in(const char *holder, const char *entry) {
    char path[64];
    snprintf(path, sizeof(path), "/proc/%s/%s", holder, entry);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        die("cannot open", path);
    return fd;
}

static void join_cgroup(const char *procs_file) {
    char pid[24];
    int len = snprintf(pid, sizeof(pid), "%d", (int)getpid());
    int fd = open(procs_file, O_WRONLY | O_CLOEXEC);
    if (fd < 0 || write(fd, pid, len) != len)
        die("cannot join the sandbox cgroup", procs_file);
    close(fd);
}

static int same_namespace(const char *a, const char *b) {
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
           sa.st_ino == sb.st_ino;
}

static void keep_only_container_caps(void) {
    uint64_t keep = 0;
    for (size_t i = 0; i < N_KEPT; i++)
        keep |= 1ULL << KEPT_CAPS[i];
    for (int cap = 0; cap <= 63; cap++) {
        if (keep & (1ULL << cap))
            continue;
        if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 && errno != EINVAL)
            die("cannot drop capability from the bounding set:", "prctl");
    }
    struct __user_cap_header_struct header = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[2];
    memset(data, 0, sizeof(data));
    for (int i = 0; i < 2; i++) {
        uint32_t word = (uint32_t)(keep >> (32 * i));
        data[i].effective = data[i].permitted = word; /* inheritable: none (CVE-2022-24769) */
    }
    if (syscall(SYS_capset, &header, data) != 0)
        die("cannot set capabilities:", "capset");
    if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0 && errno != EINVAL)
        die("cannot clear ambient capabilities:", "prctl");
}

static void lock_down(void) {
    static struct program filter;
    build_filter(&filter);
    struct sock_fprog prog = {filter.len, filter.ins};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
        die("cannot set", "no_new_privs");
    if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0) != 0)
        die("cannot load the seccomp filter:", "prctl");
}

static int print_filter(void) {
    static struct program filter;
    build_filter(&filter);
    size_t size = filter.len * sizeof(struct sock_filter);
    return fwrite(filter.ins, 1, size, stdout) == size && fflush(stdout) == 0 ? 0 : 125;
}

static int stage(int argc, char **argv) {
    /* argv: --stage DIR UID SOURCE... -- BWRAP ARGS... */
    int sep = 4;
    while (sep < argc && strcmp(argv[sep], "--") != 0)
        sep++;
    if (argc < 5 || sep + 1 >= argc) {
        fprintf(stderr, "usage: orchard-enter --stage DIR UID SOURCE... -- BWRAP ARGV...\n");
        return 125;
    }
    const char *dir = argv[2];
    uid_t uid = (uid_t)strtoul(argv[3], NULL, 10);
    if (uid == 0) {
        fprintf(stderr, "orchard-enter: refusing to stage a holder as root\n");
        return 125;
    }
    if (unshare(CLONE_NEWNS) != 0)
        die("cannot make a mount namespace for", dir);
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0)
        die("cannot make mounts private for", dir);
    if (mount("orchard-stage", dir, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755") != 0)
        die("cannot mount a tmpfs on", dir);
    for (int i = 4; i < sep; i++) {
        char target[4096];
        struct stat st;
        const char *source = argv[i];
        snprintf(target, sizeof(target), "%s/%d", dir, i - 4);
        if (stat(source, &st) != 0)
            die("cannot find", source);
        int made = S_ISDIR(st.st_mode) ? mkdir(target, 0755)
                                       : close(open(target, O_CREAT | O_WRONLY, 0644));
        if (made != 0)
            die("cannot make stage entry", target);
        if (mount(source, target, NULL, MS_BIND | MS_REC, NULL) != 0)
            die("cannot bind into the stage", source);
    }
    if (setgroups(0, NULL) != 0 || setresgid(uid, uid, uid) != 0 ||
        setresuid(uid, uid, uid) != 0)
        die("cannot become the sandbox's host uid", argv[3]);
    execv(argv[sep + 1], argv + sep + 1);
    die("cannot execute", argv[sep + 1]);
    return 125;
}

#define ENV_PREFIX "ORCHARD_ENTER_ENV_"

/* The command's environment: the prefixed entries of ours, unprefixed; nothing else. */
static char **command_environment(void) {
    extern char **environ;
    size_t n = 0, kept = 0, prefix = strlen(ENV_PREFIX);
    while (environ[n] != NULL)
        n++;
    char **out = calloc(n + 1, sizeof(char *));
    if (out == NULL)
        die("cannot allocate", "the environment");
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ[i], ENV_PREFIX, prefix) == 0 && environ[i][prefix] != '=')
            out[kept++] = environ[i] + prefix;
    return out;
}

struct target {
    const char *holder, *cwd;
    long as_uid, as_gid;
    int n_cgroups;
    char **cgroups;
};

/* Joins the holder's cgroups, namespaces and root, and becomes the sandbox's root (or the
 * image's user) with a container's capabilities, no_new_privs and the seccomp filter. */
static void enter_sandbox(const struct target *t) {
    char holder_userns[64];
    snprintf(holder_userns, sizeof(holder_userns), "/proc/%s/ns/user", t->holder);
    if (same_namespace(holder_userns, "/proc/self/ns/user")) {
        fprintf(stderr, "orchard: sandbox %s has no user namespace of its own (made by an "
                        "older orchard-env): refusing to enter it; delete and recreate it\n",
                t->holder);
        _exit(125);
    }
    int ns_fds[N_NAMESPACES];
    for (size_t i = 0; i < N_NAMESPACES; i++) {
        char entry[16];
        snprintf(entry, sizeof(entry), "ns/%s", NAMESPACES[i].name);
        ns_fds[i] = open_in(t->holder, entry);
    }
    int root_fd = open_in(t->holder, "root");
    for (int i = 0; i < t->n_cgroups; i++)
        join_cgroup(t->cgroups[i]);
    /* Host groups (root's among them) would still count for file access inside. */
    if (geteuid() == 0 && setgroups(0, NULL) != 0)
        die("cannot drop", "supplementary groups");
    for (size_t i = 0; i < N_NAMESPACES; i++) {
        if (setns(ns_fds[i], NAMESPACES[i].type) != 0)
            die("cannot enter the sandbox namespace", NAMESPACES[i].name);
        close(ns_fds[i]);
    }
    if (fchdir(root_fd) != 0 || chroot(".") != 0)
        die("cannot enter the sandbox root of", t->holder);
    close(root_fd);
    if (setresgid(0, 0, 0) != 0 || setresuid(0, 0, 0) != 0)
        die("cannot become the sandbox's root in", t->holder);
    keep_only_container_caps();
    if (t->as_uid != 0 || t->as_gid != 0) {
        gid_t group = (gid_t)t->as_gid;
        if (setgroups(1, &group) != 0 || setresgid(group, group, group) != 0 ||
            setresuid((uid_t)t->as_uid, (uid_t)t->as_uid, (uid_t)t->as_uid) != 0)
            die("cannot become the image's user in", t->holder);
    }
    if (chdir(t->cwd) != 0)
        die("cannot change to", t->cwd);
    lock_down();
}

/* In a forked child: become ARGV, searched on the PATH of ENV; never returns. */
static void exec_command(char **command, char **command_env) {
    extern char **environ;
    environ = command_env; /* execvp searches the command's PATH */
    execvp(command[0], command);
    int code = (errno == ENOENT || errno == ENOTDIR) ? 127 : 126;
    fprintf(stderr, "%s: %s\n", command[0],
            code == 127 ? "command not found" : strerror(errno));
    _exit(code);
}

/* One command: fork it into the sandbox's pid namespace, wait, exit as it did. */
static int run_one(const struct target *t, char **command) {
    pid_t child = fork();
    if (child < 0)
        die("cannot fork in", t->holder);
    char **command_env = command_environment();
    if (child == 0)
        exec_command(command, command_env);
    /* Signals meant for the command reach it through the process group; ignore the ones
     * a terminal would send so this waiter outlives its child and reports its status. */
    signal(SIGINT, SIG_IGN);
    signal(SIGQUIT, SIG_IGN);
    signal(SIGTERM, SIG_IGN);
    int status;
    while (waitpid(child, &status, 0) < 0)
        if (errno != EINTR)
            die("cannot wait for the command in", t->holder);
    if (WIFSIGNALED(status)) {
        int sig = WTERMSIG(status);
        signal(sig, SIG_DFL);
        sigset_t mask;
        sigemptyset(&mask);
        sigaddset(&mask, sig);
        sigprocmask(SIG_UNBLOCK, &mask, NULL);
        kill(getpid(), sig);
        return 128 + sig; /* a signal that does not terminate (SIGCHLD-like): exit as sh does */
    }
    return WEXITSTATUS(status);
}

/* ---- the spawner (--serve) ------------------------------------------------------- */

/* The wire format (host byte order; the agent is on the same machine). */
enum { OP_SPAWN = 1, OP_KILL = 2 };
enum { REPLY_STARTED = 1, REPLY_EXITED = 2, REPLY_FAILED = 3 };
#define SPAWN_WITH_STDIN 1u
#define MAX_REQUEST (256 * 1024)
#define MAX_STRINGS 65536

struct request {
    uint32_t op, id;  /* id: the agent's name for the command */
    uint32_t flags;   /* OP_SPAWN: SPAWN_WITH_STDIN; OP_KILL: the signal */
    uint32_t argc, envc;
    uint32_t reserved;
    /* OP_SPAWN: CWD\0 ARGV[0]\0 .. ARGV[argc-1]\0 ENV[0]\0 .. ENV[envc-1]\0 */
};

struct reply {
    uint32_t kind, id;
    int32_t pid, status;  /* REPLY_EXITED: the wait status; REPLY_FAILED: an errno */
    int64_t user_us, system_us, max_rss_kb;
};

struct child {
    pid_t pid;
    uint32_t id;
};

static struct child *children;
static size_t n_children, cap_children;
static int serve_fd;

static void send_reply(uint32_t kind, uint32_t id, pid_t pid, int status,
                       const struct rusage *ru) {
    struct reply r = {kind, id, pid, status, 0, 0, 0};
    if (ru != NULL) {
        r.user_us = (int64_t)ru->ru_utime.tv_sec * 1000000 + ru->ru_utime.tv_usec;
        r.system_us = (int64_t)ru->ru_stime.tv_sec * 1000000 + ru->ru_stime.tv_usec;
        r.max_rss_kb = ru->ru_maxrss;
    }
    while (send(serve_fd, &r, sizeof(r), MSG_NOSIGNAL) < 0)
        if (errno != EINTR)
            _exit(0); /* the agent is gone */
}

static void track(pid_t pid, uint32_t id) {
    if (n_children == cap_children) {
        size_t cap = cap_children ? cap_children * 2 : 16;
        struct child *grown = realloc(children, cap * sizeof(*children));
        if (grown == NULL) {
            kill(-pid, SIGKILL); /* cannot report it: do not leave it running */
            send_reply(REPLY_FAILED, id, 0, ENOMEM, NULL);
            return;
        }
        children = grown;
        cap_children = cap;
    }
    children[n_children++] = (struct child){pid, id};
}

static void reap_children(void) {
    for (;;) {
        int status;
        struct rusage ru;
        pid_t pid = wait4(-1, &status, WNOHANG, &ru);
        if (pid <= 0)
            return;
        for (size_t i = 0; i < n_children; i++) {
            if (children[i].pid == pid) {
                send_reply(REPLY_EXITED, children[i].id, pid, status, &ru);
                children[i] = children[--n_children];
                break;
            }
        }
    }
}

/* The request's strings as pointers into buf; NULL when they are malformed. */
static char **split_strings(char *buf, size_t len, uint32_t count) {
    if (count > MAX_STRINGS)
        return NULL;
    char **out = calloc((size_t)count + 1, sizeof(char *));
    if (out == NULL)
        return NULL;
    size_t at = 0;
    for (uint32_t i = 0; i < count; i++) {
        char *end = memchr(buf + at, '\0', len - at);
        if (end == NULL) {
            free(out);
            return NULL;
        }
        out[i] = buf + at;
        at = (size_t)(end - buf) + 1;
    }
    return out;
}

/* In the forked child: the request's fds as 0, 1, 2, its own session, then ARGV. */
static void start_child(const int *fds, int n_fds, const char *cwd, char **command,
                        char **env) {
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    int in = n_fds == 3 ? fds[2] : open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (in < 0 || dup2(in, 0) < 0 || dup2(fds[0], 1) < 0 || dup2(fds[1], 2) < 0)
        _exit(125);
    setsid();
    if (chdir(cwd) != 0) {
        fprintf(stderr, "orchard: cannot change to %s: %s\n", cwd, strerror(errno));
        _exit(125);
    }
    exec_command(command, env);
}

static void spawn_request(const struct request *req, char *strings, size_t len,
                          const int *fds, int n_fds) {
    uint32_t want = (req->flags & SPAWN_WITH_STDIN) ? 3 : 2;
    char **all = NULL;
    if (req->argc == 0 || (uint32_t)n_fds != want || req->argc > MAX_STRINGS ||
        req->envc > MAX_STRINGS ||
        (all = split_strings(strings, len, 1 + req->argc + req->envc)) == NULL) {
        send_reply(REPLY_FAILED, req->id, 0, EINVAL, NULL);
        return;
    }
    /* all: CWD, ARGV, ENV, NULL; ARGV needs a NULL of its own */
    char **command = all + 1, **env = all + 1 + req->argc;
    char **argv_copy = calloc((size_t)req->argc + 1, sizeof(char *));
    if (argv_copy == NULL) {
        free(all);
        send_reply(REPLY_FAILED, req->id, 0, ENOMEM, NULL);
        return;
    }
    memcpy(argv_copy, command, req->argc * sizeof(char *));
    pid_t pid = fork();
    if (pid == 0)
        start_child(fds, n_fds, all[0], argv_copy, env);
    int saved = errno;
    free(argv_copy);
    free(all);
    if (pid < 0) {
        send_reply(REPLY_FAILED, req->id, 0, saved, NULL);
        return;
    }
    send_reply(REPLY_STARTED, req->id, pid, 0, NULL);
    track(pid, req->id);
}

static void kill_request(const struct request *req) {
    for (size_t i = 0; i < n_children; i++) {
        if (children[i].id != req->id)
            continue;
        pid_t pid = children[i].pid;
        /* A child forked a moment ago may not have called setsid() yet, so its group does
         * not exist: signal the child itself. Not having executed anything, it has no
         * descendants; if it calls setsid() meanwhile, the group signal below finds them. */
        if (getsid(pid) != pid)
            kill(pid, (int)req->flags);
        kill(-pid, (int)req->flags);
    }
}

/* One message: false once the agent's end is closed. */
static int serve_one(char *buf) {
    int fds[3] = {-1, -1, -1}, n_fds = 0;
    union {
        char bytes[CMSG_SPACE(sizeof(int) * 3)];
        struct cmsghdr align;
    } control;
    struct iovec iov = {buf, MAX_REQUEST};
    struct msghdr msg = {0};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.bytes;
    msg.msg_controllen = sizeof(control.bytes);
    ssize_t got = recvmsg(serve_fd, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (got < 0)
        return errno == EINTR || errno == EAGAIN;
    if (got == 0)
        return 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c != NULL; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        int n = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
        for (int i = 0; i < n; i++) {
            int fd;
            memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
            if (n_fds < 3)
                fds[n_fds++] = fd;
            else
                close(fd);
        }
    }
    struct request req;
    if ((size_t)got < sizeof(req) || (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC))) {
        if ((size_t)got >= 2 * sizeof(uint32_t)) {
            memcpy(&req, buf, 2 * sizeof(uint32_t));
            send_reply(REPLY_FAILED, req.id, 0, E2BIG, NULL);
        }
    } else {
        memcpy(&req, buf, sizeof(req));
        if (req.op == OP_SPAWN)
            spawn_request(&req, buf + sizeof(req), (size_t)got - sizeof(req), fds, n_fds);
        else if (req.op == OP_KILL)
            kill_request(&req);
        else
            send_reply(REPLY_FAILED, req.id, 0, EINVAL, NULL);
    }
    for (int i = 0; i < n_fds; i++)
        close(fds[i]);
    return 1;
}

static int serve(int fd) {
    serve_fd = fd;
    if (fcntl(fd, F_SETFD, FD_CLOEXEC) != 0)
        die("cannot use the agent's socket", "fd");
    sigset_t sigchld; /* blocked here and read from a signalfd */
    sigemptyset(&sigchld);
    sigaddset(&sigchld, SIGCHLD);
    sigprocmask(SIG_BLOCK, &sigchld, NULL);
    int sfd = signalfd(-1, &sigchld, SFD_CLOEXEC | SFD_NONBLOCK);
    if (sfd < 0)
        die("cannot watch", "SIGCHLD");
    static char buf[MAX_REQUEST];
    struct pollfd watch[2] = {{fd, POLLIN, 0}, {sfd, POLLIN, 0}};
    for (;;) {
        if (poll(watch, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            die("cannot wait for", "requests");
        }
        if (watch[1].revents) {
            struct signalfd_siginfo info;
            while (read(sfd, &info, sizeof(info)) > 0)
                ;
            reap_children();
        }
        if (watch[0].revents && !serve_one(buf))
            return 0;
    }
}

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "--seccomp-bpf") == 0)
        return print_filter();
    if (argc > 1 && strcmp(argv[1], "--stage") == 0)
        return stage(argc, argv);
    struct target t = {0};
    if (argc > 2 && strcmp(argv[1], "--user") == 0) {
        char *end;
        t.as_uid = strtol(argv[2], &end, 10);
        if (*end != ':' || t.as_uid < 0 || t.as_uid > 65535)
            return fprintf(stderr, "orchard-enter: malformed --user %s\n", argv[2]), 125;
        t.as_gid = strtol(end + 1, &end, 10);
        if (*end != '\0' || t.as_gid < 0 || t.as_gid > 65535)
            return fprintf(stderr, "orchard-enter: malformed --user %s\n", argv[2]), 125;
        argc -= 2;
        argv += 2;
    }
    if (argc < 6) {
        fprintf(stderr, "usage: orchard-enter [--user UID:GID] HOLDER_PID CWD N "
                        "CGROUP_PROCS... (-- ARGV... | --serve FD)\n");
        return 125;
    }
    t.holder = argv[1];
    t.cwd = argv[2];
    t.n_cgroups = atoi(argv[3]);
    t.cgroups = argv + 4;
    int serving = 0, serve_on = -1;
    if (t.n_cgroups >= 0 && 4 + t.n_cgroups + 1 < argc &&
        strcmp(argv[4 + t.n_cgroups], "--serve") == 0 && 6 + t.n_cgroups == argc) {
        serving = 1;
        serve_on = atoi(argv[5 + t.n_cgroups]);
    }
    if (!serving && (t.n_cgroups < 0 || 4 + t.n_cgroups >= argc ||
                     strcmp(argv[4 + t.n_cgroups], "--") != 0 || 5 + t.n_cgroups >= argc)) {
        fprintf(stderr, "orchard-enter: malformed arguments\n");
        return 125;
    }
    if (serving && serve_on < 3) {
        fprintf(stderr, "orchard-enter: malformed --serve fd\n");
        return 125;
    }
    pid_t agent = getppid();
    enter_sandbox(&t);
    if (!serving)
        return run_one(&t, argv + 5 + t.n_cgroups);
    /* Set after every credential change (they clear it); the agent may already be gone. */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0 || getppid() != agent)
        return 0;
    return serve(serve_on);
}
