/* Preloaded in gVisor's sandboxes (SUBAGENTD_SANDBOX_RUNTIME=gvisor; see src/tools/gvisor.rs).
 *
 * Debian's runsc (0.0~20221219) answers statx(2) and fstatat(2) with EINVAL when they are given
 * AT_NO_AUTOMOUNT, and coreutils' ls, stat, du and cp give it: every `ls` of a file would fail.
 * gVisor has no automounts, so the flag means nothing there: this library drops it and makes the
 * call. It uses no libc (raw system calls, errno through __errno_location, which glibc and musl
 * both have), so that it loads in any image's programs. Built by build.rs. */

#define AT_NO_AUTOMOUNT 0x800

extern int *__errno_location(void);

#if defined(__x86_64__)
#define SYS_NEWFSTATAT 262
#define SYS_STATX 332
static long call5(long n, long a, long b, long c, long d, long e) {
    long r;
    register long r10 __asm__("r10") = d;
    register long r8 __asm__("r8") = e;
    __asm__ volatile("syscall"
                     : "=a"(r)
                     : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8)
                     : "rcx", "r11", "memory");
    return r;
}
#elif defined(__aarch64__)
#define SYS_NEWFSTATAT 79
#define SYS_STATX 291
static long call5(long n, long a, long b, long c, long d, long e) {
    register long x8 __asm__("x8") = n;
    register long x0 __asm__("x0") = a;
    register long x1 __asm__("x1") = b;
    register long x2 __asm__("x2") = c;
    register long x3 __asm__("x3") = d;
    register long x4 __asm__("x4") = e;
    __asm__ volatile("svc 0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2), "r"(x3), "r"(x4) : "memory");
    return x0;
}
#else
#error "no system calls for this architecture"
#endif

static int answer(long r) {
    if (r < 0 && r > -4096) {
        *__errno_location() = (int)-r;
        return -1;
    }
    return (int)r;
}

int statx(int dirfd, const char *path, int flags, unsigned int mask, void *buf) {
    return answer(call5(SYS_STATX, dirfd, (long)path, flags & ~AT_NO_AUTOMOUNT, mask, (long)buf));
}

int fstatat(int dirfd, const char *path, void *buf, int flags) {
    return answer(call5(SYS_NEWFSTATAT, dirfd, (long)path, (long)buf, flags & ~AT_NO_AUTOMOUNT, 0));
}

int fstatat64(int dirfd, const char *path, void *buf, int flags) {
    return fstatat(dirfd, path, buf, flags);
}
