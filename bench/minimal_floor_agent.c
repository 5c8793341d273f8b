/* The minimal guest agent of bench/minimal_floor.py: the least a guest can do to answer
 * "run /bin/sh -c true" over virtio-serial, so the floor it is part of has no agent cost
 * beyond one fork, one exec and one wait.
 *
 * Usage (from the floor's initramfs /init): agent PORT ROOT
 *   PORT  the virtio-serial port's device (/dev/vportNpM), opened before the chroot
 *   ROOT  the mounted root disk; the agent chroots into it, so the command runs the root
 *         disk's /bin/sh with its libc, as a sandbox's command does
 *
 * Protocol: each byte the host sends is one request; the answer is one byte, 0 for success.
 * 'p': nothing (the cost of waking the guest and the agent alone). The parts of our agent's
 * `init` (guest-agent/src/sysinit.rs), each alone, to tell what each costs a restored guest:
 * 'c' sets the clock an hour forward (a template an hour old), 'r' adds 64 bytes of entropy
 * and reseeds the RNG, 'h' sets the hostname. 'g': `/bin/sh -c true` entered into a cgroup
 * leaf between fork and exec, as our agent runs each command (guest-agent/src/cgroups.rs).
 * Any other byte: the exit status of `/bin/sh -c true` (255 when it did not exit normally).
 * Built with gcc -static.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/random.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define LEAF_PROCS "/sys/fs/cgroup/floor/leaf/cgroup.procs"

static int run_true(int in_leaf) {
    int leaf = in_leaf ? open(LEAF_PROCS, O_WRONLY | O_CLOEXEC) : -1;
    if (in_leaf && leaf < 0)
        return 254;
    pid_t pid = fork();
    if (pid < 0)
        return 255;
    if (pid == 0) {
        if (leaf >= 0 && write(leaf, "0", 1) != 1)
            _exit(126);
        char *const argv[] = {"sh", "-c", "true", NULL};
        char *const envp[] = {"PATH=/usr/local/bin:/usr/bin:/bin", NULL};
        execve("/bin/sh", argv, envp);
        _exit(127);
    }
    if (leaf >= 0)
        close(leaf);
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR)
            return 255;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 255;
}

static int random_fd = -1;

static int clock_forward(void) {
    struct timespec now;
    if (clock_gettime(CLOCK_REALTIME, &now) != 0)
        return 1;
    now.tv_sec += 3600;
    return clock_settime(CLOCK_REALTIME, &now) != 0;
}

static int reseed(void) {
    struct {
        struct rand_pool_info info;
        unsigned char buf[64];
    } pool;
    pool.info.entropy_count = 64 * 8;
    pool.info.buf_size = 64;
    for (unsigned i = 0; i < sizeof pool.buf; i++)
        pool.buf[i] = (unsigned char)(i * 131 + 7);
    return random_fd < 0 || ioctl(random_fd, RNDADDENTROPY, &pool) != 0
           || ioctl(random_fd, RNDRESEEDCRNG) != 0;
}

static int answer(char request) {
    switch (request) {
    case 'p': return 0;
    case 'c': return clock_forward();
    case 'r': return reseed();
    case 'h': return sethostname("sbx-0123456789ab", strlen("sbx-0123456789ab")) != 0;
    case 'g': return run_true(1);
    default: return run_true(0);
    }
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s PORT ROOT\n", argv[0]);
        return 2;
    }
    int fd = open(argv[1], O_RDWR);
    if (fd < 0) {
        perror(argv[1]);
        return 1;
    }
    random_fd = open("/dev/random", O_WRONLY | O_CLOEXEC); /* before the chroot */
    if (chroot(argv[2]) != 0 || chdir("/") != 0) {
        perror("chroot");
        return 1;
    }
    fprintf(stderr, "FLOOR_AGENT_READY\n");
    /* A read gives 0 while no host end is connected: wait for one without spinning. */
    const struct timespec idle = {0, 5 * 1000 * 1000};
    char requests[64];
    for (;;) {
        ssize_t n = read(fd, requests, sizeof requests);
        if (n == 0 || (n < 0 && errno == EAGAIN)) {
            nanosleep(&idle, NULL);
            continue;
        }
        if (n < 0) {
            if (errno == EINTR)
                continue;
            perror("read");
            nanosleep(&idle, NULL);
            continue;
        }
        for (ssize_t i = 0; i < n; i++) {
            unsigned char status = (unsigned char)answer(requests[i]);
            while (write(fd, &status, 1) < 0 && errno == EINTR)
                ;
        }
    }
}
