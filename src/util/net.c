#include "util/net.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>

static int address_is_loopback(const struct sockaddr *sa)
{
	if (sa->sa_family == AF_INET) {
		const struct sockaddr_in *in = (const struct sockaddr_in *)(const void *)sa;
		return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
	}
	if (sa->sa_family == AF_INET6) {
		const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)(const void *)sa;
		if (IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr))
			return 1;
		/* ::ffff:127.x.y.z */
		return IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr) && in6->sin6_addr.s6_addr[12] == 127;
	}
	return 0;
}

int net_host_is_loopback(const char *host)
{
	if (!host || !*host)
		return 0;
	struct addrinfo hints, *res = NULL;
	memset(&hints, 0, sizeof hints);
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	if (getaddrinfo(host, NULL, &hints, &res) != 0 || !res)
		return 0;
	int all = 1;
	for (struct addrinfo *ai = res; ai; ai = ai->ai_next)
		if (!address_is_loopback(ai->ai_addr))
			all = 0;
	freeaddrinfo(res);
	return all;
}
