/* Doubles written as llama-server's template engine writes them in tojson
 * (seen against build 11669; Python's repr does the same): the shortest
 * digits that read back as the same double, a decimal point kept on whole
 * numbers ("100.0"), plain notation while the point falls from 4 places
 * before the first digit to 16 after it (0.0001, 1000000000000000.0), else
 * d.ddde+XX with at least two exponent digits (1e-05, 1e+16). */
#ifndef TOKI_UTIL_DTOA_H
#define TOKI_UTIL_DTOA_H

#include <stddef.h>

/* Writes v into out (at least 32 bytes); returns the length. NaN and
 * infinities are written as nlohmann does not (it writes null); callers
 * decide. */
size_t dtoa_nlohmann(double v, char *out);

/* The same layout with the plain notation kept while the point falls at most
 * max_point places after the first digit: 16 above; nlohmann's own dump (its
 * kMaxExp), which anthropic_dump_json follows, switches one place earlier, at
 * 15 (1e+15). One writer, so that the two cannot drift apart elsewhere. */
size_t dtoa_shortest(double v, int max_point, char *out);

#endif
