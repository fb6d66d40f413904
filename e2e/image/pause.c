/* The Pod sandbox ("pause") process of the real node's Pods: holds the Pod's
 * namespaces, reaps orphans, exits on SIGINT/SIGTERM. Built static by
 * e2e/image/test-images.sh (no registry image is pulled). */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) { (void)sig; _exit(0); }

static void reap(int sig) {
  (void)sig;
  while (waitpid(-1, 0, WNOHANG) > 0) {
  }
}

int main(void) {
  struct sigaction term = {.sa_handler = stop};
  struct sigaction child = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP};
  sigaction(SIGINT, &term, 0);
  sigaction(SIGTERM, &term, 0);
  sigaction(SIGCHLD, &child, 0);
  for (;;) pause();
}
