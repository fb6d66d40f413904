/* The counting sink of `make bench`'s real-kubelet comparison
 * (benches/cluster/kubelet_side.rs), the main process of a container on the
 * real node: on port argv[1], each connection says how many bytes follow
 * (8 bytes, big-endian), sends them, and is answered with the count read
 * (8 bytes, big-endian) and closed, as the bench's sized sink answers for
 * the sandbox side. Not read to EOF: a port-forward through the kubelet
 * and containerd does not carry a half-close. Built static with musl-gcc:
 * the busybox image has no C library. */
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
    unsigned char len[8];
    size_t got = 0;
    ssize_t k;
    while (got < sizeof len && (k = read(c, len + got, sizeof len - got)) > 0) got += (size_t)k;
    uint64_t want = 0;
    for (int i = 0; i < 8; i++) want = (want << 8) | len[i];
    uint64_t n = 0;
    while (got == sizeof len && n < want) {
      size_t ask = want - n < sizeof buf ? (size_t)(want - n) : sizeof buf;
      if ((k = read(c, buf, ask)) <= 0) break;
      n += (uint64_t)k;
    }
    unsigned char out[8];
    for (int i = 0; i < 8; i++) out[i] = (unsigned char)(n >> (56 - 8 * i));
    ssize_t w = write(c, out, sizeof out);
    (void)w;
    close(c);
  }
}
