/* The egress listener of `--network allow` (sandbox-exec, and any other spawn path that starts a
 * command in a network namespace of its own).
 *
 * A command under `--network allow` has a network namespace with loopback alone: no route out.
 * Its one way out is a TCP listener on EGRESS_ADDR:EGRESS_PORT made INSIDE that namespace (a
 * socket keeps the namespace it was made in) and handed to the service over a unix socket with
 * SCM_RIGHTS. The service's egress proxy accepts on it directly: no forwarder process, no socket
 * file, and the listener belongs to one command, so each connection is attributed to its session
 * and request. The sandbox keeps no copy: once sent, the listener is the service's alone (a
 * command that binds the port itself finds it taken).
 *
 * Call egress_send_listener() in a process already in the command's network namespace with lo up,
 * before the command is forked. No stdio, no malloc: on failure it returns -1 with errno set and
 * *step naming the call, so the caller reports it.
 */
#ifndef SMITH_FAST_EGRESS_LISTENER_H
#define SMITH_FAST_EGRESS_LISTENER_H

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "fd_passing.h"

/* Where the command's proxy variables point (smith_fast/sandbox: EGRESS_PORT must agree). 3128 is
 * the customary port of an HTTP proxy; the namespace is the command's own, so it clashes with nothing. */
#define EGRESS_ADDR "127.0.0.1"
#define EGRESS_PORT 3128
#define EGRESS_BACKLOG 256

/* Make the listener and send it over channel (a unix socket); both are closed here, whatever happens. */
static int egress_send_listener(int channel, const char **step) {
    int one = 1, saved;
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_port = htons(EGRESS_PORT);
    inet_pton(AF_INET, EGRESS_ADDR, &addr.sin_addr);
    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0) { *step = "socket"; goto fail; }
    if (setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0) { *step = "SO_REUSEADDR"; goto fail; }
    if (bind(s, (struct sockaddr *)&addr, sizeof addr) != 0) { *step = "bind 127.0.0.1:3128"; goto fail; }
    if (listen(s, EGRESS_BACKLOG) != 0) { *step = "listen"; goto fail; }

    if (send_fd(channel, s, 'L') != 0) { *step = "sending the egress listener"; goto fail; }
    close(s);
    close(channel);
    return 0;
fail:
    saved = errno;
    if (s >= 0) close(s);
    close(channel);
    errno = saved;
    return -1;
}

#endif
