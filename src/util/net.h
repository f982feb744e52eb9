/* Questions about network addresses that more than one command asks. */
#ifndef TOKI_NET_H
#define TOKI_NET_H

/* 1 if every address host resolves to is a loopback address (127.0.0.0/8,
 * ::1), 0 otherwise, including when it does not resolve. What the name
 * resolves to decides, not how it looks: "127.example.com" may be public. */
int net_host_is_loopback(const char *host);

#endif
