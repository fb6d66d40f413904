/* The counting sink of `make bench`'s real-kubelet comparison
 * (benches/cluster/kubelet_side.rs), the main process of a container on the
 * real node: on port argv[1], each connection is read to its end, then
 * answered with the byte count (8 bytes, big-endian) and closed, as the
 * bench's in-process sink answers for the sandbox side. Built static with
 * musl-gcc: the busybox image has no C library. */
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

static char buf[256 * 1024];

int main(int argc, char **argv) {
  int port = argc > 1 ? atoi(argv[1]) : 9000;
  int l = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
  if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof a) || listen(l, 16)) {
    perror("sink: listen");
    return 1;
  }
  printf("sink: listening on %d\n", port);
  fflush(stdout);
  for (;;) {
    int c = accept(l, 0, 0);
    if (c < 0) continue;
    uint64_t n = 0;
    ssize_t k;
    while ((k = read(c, buf, sizeof buf)) > 0) n += (uint64_t)k;
    unsigned char out[8];
    for (int i = 0; i < 8; i++) out[i] = (unsigned char)(n >> (56 - 8 * i));
    ssize_t w = write(c, out, sizeof out);
    (void)w;
    close(c);
  }
}
