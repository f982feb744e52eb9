#include "util/dtoa.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The shortest %.*e form that reads back as v: its digits (no point) and
 * the decimal exponent of the first digit. */
static int shortest_digits(double v, char *digits, int *exp10)
{
	char buf[40];
	for (int prec = 0; prec < 17; prec++) {
		snprintf(buf, sizeof buf, "%.*e", prec, v);
		if (strtod(buf, NULL) == v)
			break;
	}
	/* buf: d[.ddd]e[+-]XX */
	int k = 0;
	const char *p = buf;
	for (; *p && *p != 'e'; p++)
		if (*p >= '0' && *p <= '9')
			digits[k++] = *p;
	*exp10 = atoi(p + 1);
	/* Trailing zeros of the mantissa carry nothing. */
	while (k > 1 && digits[k - 1] == '0')
		k--;
	digits[k] = 0;
	return k;
}

size_t dtoa_shortest(double v, int max_point, char *out)
{
	if (isnan(v) || isinf(v))
		return (size_t)snprintf(out, 32, "%s", isnan(v) ? "nan" : v < 0 ? "-inf" : "inf");
	char *o = out;
	if (signbit(v)) {
		*o++ = '-';
		v = -v;
	}
	if (v == 0) {
		memcpy(o, "0.0", 4);
		return (size_t)(o - out) + 3;
	}
	char d[24];
	int e;
	int k = shortest_digits(v, d, &e);
	int n = e + 1; /* position of the decimal point after the first k digits */
	if (k <= n && n <= max_point) {
		memcpy(o, d, (size_t)k);
		memset(o + k, '0', (size_t)(n - k));
		o += n;
		*o++ = '.';
		*o++ = '0';
	} else if (0 < n && n <= max_point) {
		memcpy(o, d, (size_t)n);
		o += n;
		*o++ = '.';
		memcpy(o, d + n, (size_t)(k - n));
		o += k - n;
	} else if (-4 < n && n <= 0) {
		*o++ = '0';
		*o++ = '.';
		memset(o, '0', (size_t)-n);
		o += -n;
		memcpy(o, d, (size_t)k);
		o += k;
	} else {
		*o++ = d[0];
		if (k > 1) {
			*o++ = '.';
			memcpy(o, d + 1, (size_t)(k - 1));
			o += k - 1;
		}
		int x = n - 1;
		o += sprintf(o, "e%c%02d", x < 0 ? '-' : '+', x < 0 ? -x : x);
	}
	*o = 0;
	return (size_t)(o - out);
}

size_t dtoa_nlohmann(double v, char *out)
{
	return dtoa_shortest(v, 16, out);
}
