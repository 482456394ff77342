/* Which Host headers the API answers (DNS rebinding): a web page on a name its author
 * controls, pointed at 127.0.0.1, reaches the server with that name in Host, so only
 * names such a page cannot use are answered. Pure: no state, no allocation. */
#pragma once

#include <stdbool.h>
#include <stddef.h>

/* True for no header (HTTP/1.0), an IP literal (IPv6 in brackets), with or without a
 * numeric port: "localhost" or a name under ".localhost", own (this machine's name, ""
 * for none) or own + ".local", and any of the n names (case-insensitive; a trailing dot
 * is ignored). False for everything else, malformed ports included. */
bool http_host_allowed(const char *host, const char *own, const char *const *names, size_t n);

/* True when a listening address reaches only this machine: NULL or "" (the default,
 * 127.0.0.1), 127.0.0.0/8, ::1, ::ffff:127.x.x.x, "localhost". False for "0.0.0.0",
 * "::", any other address or name. */
bool http_addr_is_loopback(const char *addr);
