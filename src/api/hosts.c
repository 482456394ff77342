#include "api/hosts.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

bool http_host_allowed(const char *host, const char *own, const char *const *names, size_t n)
{
    if (!host)
        return true;
    char name[256];
    size_t len = strlen(host);
    if (len == 0 || len >= sizeof name)
        return false;
    if (host[0] == '[') { /* [IPv6]:port */
        const char *end = strchr(host, ']');
        if (!end || (end[1] && end[1] != ':') || (end[1] && strspn(end + 2, "0123456789") != strlen(end + 2)))
            return false;
        snprintf(name, sizeof name, "%.*s", (int)(end - host - 1), host + 1);
        struct in6_addr a6;
        return inet_pton(AF_INET6, name, &a6) == 1;
    }
    const char *colon = strchr(host, ':');
    if (colon && strspn(colon + 1, "0123456789") != strlen(colon + 1))
        return false;
    size_t k = colon ? (size_t)(colon - host) : len;
    memcpy(name, host, k);
    name[k] = 0;
    if (k && name[k - 1] == '.') /* "localhost." is localhost */
        name[--k] = 0;
    struct in_addr a4;
    if (inet_pton(AF_INET, name, &a4) == 1)
        return true;
    if (!strcasecmp(name, "localhost") || (k > 10 && !strcasecmp(name + k - 10, ".localhost")))
        return true;
    size_t o = own ? strlen(own) : 0;
    if (o && !strncasecmp(name, own, o) && (!name[o] || !strcasecmp(name + o, ".local")))
        return true;
    for (size_t i = 0; i < n; i++)
        if (names[i] && !strcasecmp(name, names[i]))
            return true;
    return false;
}

bool http_addr_is_loopback(const char *addr)
{
    if (!addr || !addr[0] || !strcasecmp(addr, "localhost"))
        return true;
    struct in_addr v4;
    struct in6_addr v6;
    if (inet_pton(AF_INET, addr, &v4) == 1)
        return (ntohl(v4.s_addr) >> 24) == 127;
    if (inet_pton(AF_INET6, addr, &v6) != 1)
        return false;
    if (IN6_IS_ADDR_LOOPBACK(&v6))
        return true;
    return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
}
