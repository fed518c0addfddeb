// Loopback sockets for tests that speak to a server byte by byte.
#ifndef KVSERVE_TESTS_TESTING_NET_H_
#define KVSERVE_TESTS_TESTING_NET_H_

namespace kvserve::testing {

// A TCP socket connected to 127.0.0.1:port (-1 on failure); a `receive_buffer` > 0 is its
// SO_RCVBUF, set before connecting, so that what the client does not read backs up at the
// server sooner.
int ConnectLoopback(int port, int receive_buffer = 0);

// A TCP socket listening on 127.0.0.1 at a free port, which goes in `*port` (-1 on failure);
// accepts do not wait when `nonblocking`.
int ListenLoopback(int* port, bool nonblocking = false);

}  // namespace kvserve::testing

#endif  // KVSERVE_TESTS_TESTING_NET_H_
