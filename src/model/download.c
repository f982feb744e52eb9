/* Downloads with libcurl: resumable, checked, atomic (see download.h).
 *
 * The SHA-256 is computed while the data streams in (after hashing whatever a
 * previous attempt left in <dest>.part), so a 40 GB model is read from disk
 * once, not twice. The partial file is locked with flock() for the duration,
 * so two pulls of the same file at once cannot interleave their bytes. */
#include "model/download.h"
#include "platform/platform.h"
#include "util/bytes.h"
#include "util/err.h"
#include "util/grow.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>
#include <openssl/evp.h>

#ifndef TOKI_VERSION
#define TOKI_VERSION "dev"
#endif

#define USER_AGENT "toki/" TOKI_VERSION
/* A stalled connection (no byte for this long) is an error, not a hang. */
#define STALL_SECONDS 60L
#define CONNECT_SECONDS 30L
/* download_to_memory is for API answers; anything bigger is a mistake. */
#define MEMORY_LIMIT (64u << 20)

/* curl_global_init is not thread-safe; toki calls downloads from its main
 * thread only, so a flag is enough to do it once. */
static int curl_ready(char *err, size_t errlen)
{
	static int done;
	if (done)
		return 0;
	CURLcode rc = curl_global_init(CURL_GLOBAL_DEFAULT);
	if (rc != CURLE_OK) {
		err_set(err, errlen, "cannot initialise libcurl: %s", curl_easy_strerror(rc));
		return -1;
	}
	done = 1;
	return 0;
}

/* Hashes the whole of fd from its current position into ctx. */
static int hash_fd(int fd, EVP_MD_CTX *ctx)
{
	unsigned char buf[1 << 16];
	for (;;) {
		ssize_t r = read(fd, buf, sizeof buf);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return -1;
		if (r == 0)
			return 0;
		if (EVP_DigestUpdate(ctx, buf, (size_t)r) != 1)
			return -1;
	}
}

int sha256_file(const char *path, char hex[65])
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	EVP_MD_CTX *ctx = EVP_MD_CTX_new();
	int rc = -1;
	if (ctx && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) == 1 && hash_fd(fd, ctx) == 0) {
		unsigned char md[EVP_MAX_MD_SIZE];
		unsigned len = 0;
		if (EVP_DigestFinal_ex(ctx, md, &len) == 1 && len == 32) {
			bytes_hex(md, len, hex);
			rc = 0;
		}
	}
	int saved = errno;
	EVP_MD_CTX_free(ctx);
	close(fd);
	errno = saved;
	return rc;
}

/* --- progress ------------------------------------------------------------ */

struct progress {
	int enabled;
	int tty;
	const char *label;
	curl_off_t start;     /* bytes already there before this transfer */
	int last_decile;      /* last 10% step reported (pipes, logs) */
	double last_draw;     /* monotonic seconds of the last redraw */
	double t0;            /* when this transfer started */
	curl_off_t last_size; /* for the unknown-size case */
	int drawn;            /* a bar is on screen and needs its newline */
};

static double now_seconds(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static double mib(curl_off_t bytes)
{
	return (double)bytes / (1024.0 * 1024.0);
}

/* "12.3 MiB", "4.1 GiB" or "512 KiB": a small file is not "0.0 MiB". */
static const char *human(curl_off_t bytes, char *buf, size_t n)
{
	double b = (double)bytes;
	if (b >= 1000.0 * 1024.0 * 1024.0)
		snprintf(buf, n, "%.2f GiB", b / (1024.0 * 1024.0 * 1024.0));
	else if (b >= 1000.0 * 1024.0)
		snprintf(buf, n, "%.1f MiB", b / (1024.0 * 1024.0));
	else
		snprintf(buf, n, "%.0f KiB", b / 1024.0);
	return buf;
}

static void progress_show(struct progress *p, curl_off_t have, curl_off_t total, int final)
{
	if (!p->enabled)
		return;
	char h1[32], h2[32];
	double t = now_seconds();
	if (p->tty) {
		/* A redraw per curl callback would flood a slow terminal. The label
		 * is cut to 32 bytes so that the bar fits on one 100-column line
		 * (a wrapped line cannot be redrawn with \r). */
		if (!final && t - p->last_draw < 0.1)
			return;
		p->last_draw = t;
		double elapsed = t - p->t0;
		double rate = elapsed > 0.2 ? mib(have - p->start) / elapsed : 0.0;
		if (total > 0) {
			int pct = (int)(have * 100 / total);
			int fill = (int)(have * 30 / total);
			char bar[31];
			for (int i = 0; i < 30; i++)
				bar[i] = i < fill ? '#' : '.';
			bar[30] = '\0';
			fprintf(stderr, "\r%.32s [%s] %3d%% %s / %s  %.1f MiB/s\033[K", p->label,
			        bar, pct, human(have, h1, sizeof h1), human(total, h2, sizeof h2),
			        rate);
		} else {
			fprintf(stderr, "\r%.32s %s  %.1f MiB/s\033[K", p->label,
			        human(have, h1, sizeof h1), rate);
		}
		p->drawn = 1;
		if (final) {
			fputc('\n', stderr);
			p->drawn = 0;
		}
		return;
	}
	/* Not a terminal: a line per 10% so that a log shows movement without
	 * carriage-return noise. */
	if (total > 0) {
		int decile = (int)(have * 10 / total);
		if (decile > p->last_decile) {
			p->last_decile = decile;
			fprintf(stderr, "%s: %d%% (%s of %s)\n", p->label, decile * 10,
			        human(have, h1, sizeof h1), human(total, h2, sizeof h2));
		}
	} else if (have - p->last_size >= (curl_off_t)64 << 20 || (final && have != p->last_size)) {
		p->last_size = have;
		fprintf(stderr, "%s: %s\n", p->label, human(have, h1, sizeof h1));
	}
}

static void progress_end(struct progress *p)
{
	if (p->enabled && p->tty && p->drawn) {
		fputc('\n', stderr);
		p->drawn = 0;
	}
}

/* --- one transfer into <dest>.part --------------------------------------- */

struct transfer {
	int fd;
	const char *url;
	EVP_MD_CTX *sha;
	curl_off_t offset;   /* bytes in the part file when the request was sent */
	curl_off_t received; /* body bytes taken from this response */
	curl_off_t total;    /* final size when known, else -1 */
	/* From the headers of the latest response (a redirect has its own). */
	curl_off_t range_start;
	curl_off_t range_total;
	curl_off_t content_length;
	int decided; /* the first body byte settled what to do with the body */
	long status;
	char body[512]; /* start of an error response's body, for the message */
	size_t body_len;
	char fail[512]; /* why the write callback stopped the transfer */
	struct progress *progress;
	CURL *curl;
};

static int parse_off(const char *s, const char *end, curl_off_t *out)
{
	curl_off_t v = 0;
	const char *p = s;
	if (p >= end || *p < '0' || *p > '9')
		return -1;
	for (; p < end && *p >= '0' && *p <= '9'; p++) {
		if (v > (INT64_MAX - 9) / 10)
			return -1;
		v = v * 10 + (*p - '0');
	}
	*out = v;
	return (int)(p - s);
}

static size_t on_header(char *buf, size_t size, size_t nitems, void *arg)
{
	struct transfer *t = arg;
	size_t len = size * nitems;
	const char *end = buf + len;
	if (len >= 5 && !strncmp(buf, "HTTP/", 5)) {
		/* A new response (after a redirect or a 100): forget the last one's. */
		t->range_start = -1;
		t->range_total = -1;
		t->content_length = -1;
		return len;
	}
	if (len > 15 && !strncasecmp(buf, "Content-Range:", 14)) {
		const char *p = buf + 14;
		while (p < end && (*p == ' ' || *p == '\t'))
			p++;
		if (end - p > 6 && !strncasecmp(p, "bytes ", 6)) {
			p += 6;
			curl_off_t a = -1, b = -1, c = -1;
			int n = parse_off(p, end, &a);
			if (n > 0 && p + n < end && p[n] == '-') {
				p += n + 1;
				n = parse_off(p, end, &b);
				if (n > 0 && p + n < end && p[n] == '/' &&
				    parse_off(p + n + 1, end, &c) > 0) {
					t->range_start = a;
					t->range_total = c;
				}
			} else if (*p == '*' && p + 1 < end && p[1] == '/') {
				/* "bytes * /size" (a 416): only the size. */
				if (parse_off(p + 2, end, &c) > 0)
					t->range_total = c;
			}
		}
	} else if (len > 15 && !strncasecmp(buf, "Content-Length:", 15)) {
		const char *p = buf + 15;
		while (p < end && (*p == ' ' || *p == '\t'))
			p++;
		curl_off_t v;
		if (parse_off(p, end, &v) > 0)
			t->content_length = v;
	}
	return len;
}

static int write_all(int fd, const char *p, size_t n)
{
	while (n) {
		ssize_t w = write(fd, p, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0)
			return -1;
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

/* The first byte of the final response decides where the body goes: appended
 * (206 at our offset), over the part file (200: the server ignored Range), or
 * into a small buffer for the error message (anything else). */
static int decide(struct transfer *t, CURL *curl)
{
	curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &t->status);
	t->decided = 1;
	if (t->status == 206) {
		if (t->range_start != t->offset) {
			snprintf(t->fail, sizeof t->fail,
			         "the server answered a resume from byte %" PRId64
			         " with data from byte %" PRId64,
			         (int64_t)t->offset, (int64_t)t->range_start);
			return -1;
		}
		t->total = t->range_total;
		return 0;
	}
	if (t->status == 200) {
		if (t->offset > 0) {
			/* No resume support: start over, and the hash with it. */
			if (ftruncate(t->fd, 0) != 0 || lseek(t->fd, 0, SEEK_SET) != 0) {
				snprintf(t->fail, sizeof t->fail,
				         "cannot truncate the partial file: %s", strerror(errno));
				return -1;
			}
			t->offset = 0;
			EVP_DigestInit_ex(t->sha, EVP_sha256(), NULL);
			if (t->progress)
				t->progress->start = 0;
		}
		t->total = t->content_length;
		return 0;
	}
	return 0;
}

static size_t on_body(char *buf, size_t size, size_t nmemb, void *arg)
{
	struct transfer *t = arg;
	size_t len = size * nmemb;
	if (!t->decided && decide(t, t->curl) != 0)
		return 0; /* makes curl stop with CURLE_WRITE_ERROR */
	if (t->status != 200 && t->status != 206) {
		size_t room = sizeof t->body - 1 - t->body_len;
		size_t n = len < room ? len : room;
		memcpy(t->body + t->body_len, buf, n);
		t->body_len += n;
		t->body[t->body_len] = '\0';
		return len;
	}
	if (write_all(t->fd, buf, len) != 0) {
		snprintf(t->fail, sizeof t->fail, "cannot write the partial file: %s",
		         strerror(errno));
		return 0;
	}
	EVP_DigestUpdate(t->sha, buf, len);
	t->received += (curl_off_t)len;
	return len;
}

static int on_progress(void *arg, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal,
                       curl_off_t ulnow)
{
	struct transfer *t = arg;
	if (!t->decided || (t->status != 200 && t->status != 206))
		return 0;
	curl_off_t total = t->total >= 0 ? t->total : dltotal > 0 ? t->offset + dltotal : -1;
	progress_show(t->progress, t->offset + t->received, total, 0);
	return 0;
}

/* Makes an error body printable on one line: an HTML page or JSON with
 * newlines and control characters would garble the terminal. */
static void tidy_body(char *s)
{
	size_t o = 0;
	for (size_t i = 0; s[i]; i++) {
		unsigned char c = (unsigned char)s[i];
		if (c < 0x20 || c == 0x7f)
			c = ' ';
		if (c == ' ' && (o == 0 || s[o - 1] == ' '))
			continue;
		s[o++] = (char)c;
	}
	while (o && s[o - 1] == ' ')
		o--;
	s[o] = '\0';
	if (o > 200)
		strcpy(s + 197, "...");
}

static struct curl_slist *common_headers(const char *bearer_token, int *oom)
{
	struct curl_slist *h = NULL;
	*oom = 0;
	if (bearer_token && *bearer_token) {
		/* A header rather than CURLOPT_XOAUTH2_BEARER: curl (>= 7.58) drops
		 * a custom Authorization header when a redirect leaves the host, so
		 * the token never reaches the hub's CDN or S3. */
		size_t n = strlen(bearer_token) + 32;
		char *line = malloc(n);
		if (!line) {
			*oom = 1;
			return NULL;
		}
		snprintf(line, n, "Authorization: Bearer %s", bearer_token);
		struct curl_slist *h2 = curl_slist_append(h, line);
		/* curl copies the string; the token must not linger in our heap. */
		memset(line, 0, n);
		free(line);
		if (!h2) {
			*oom = 1;
			return NULL;
		}
		h = h2;
	}
	return h;
}

static void common_options(CURL *curl, const char *url, struct curl_slist *headers)
{
	curl_easy_setopt(curl, CURLOPT_URL, url);
	curl_easy_setopt(curl, CURLOPT_FOLLOWLOCATION, 1L);
	curl_easy_setopt(curl, CURLOPT_MAXREDIRS, 10L);
	curl_easy_setopt(curl, CURLOPT_USERAGENT, USER_AGENT);
	curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT, CONNECT_SECONDS);
	curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, 1L);
	curl_easy_setopt(curl, CURLOPT_LOW_SPEED_TIME, STALL_SECONDS);
	curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
	curl_easy_setopt(curl, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
	if (headers)
		curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
}

/* One HTTP request that appends to the part file from its current end.
 * Returns 0 when the body arrived whole, 1 when the server said the range is
 * past the end (the part file may already be complete), or -1. *appended
 * says whether the data went after bytes an earlier attempt left. */
static int fetch_into_part(const struct download_opts *o, int fd, EVP_MD_CTX *sha,
                           struct progress *prog, curl_off_t *final_size, int *appended,
                           int *transient, char *err, size_t errlen)
{
	*transient = 0;
	struct stat st;
	if (fstat(fd, &st) != 0) {
		err_set(err, errlen, "cannot stat the partial file %s.part: %s", o->dest,
		        strerror(errno));
		return -1;
	}
	struct transfer t = {.fd = fd,
	                     .url = o->url,
	                     .sha = sha,
	                     .offset = st.st_size,
	                     .total = -1,
	                     .range_start = -1,
	                     .range_total = -1,
	                     .content_length = -1,
	                     .progress = prog};
	if (lseek(fd, 0, SEEK_END) < 0) {
		err_set(err, errlen, "cannot seek in %s.part: %s", o->dest, strerror(errno));
		return -1;
	}
	int oom;
	struct curl_slist *headers = common_headers(o->bearer_token, &oom);
	CURL *curl = oom ? NULL : curl_easy_init();
	if (!curl) {
		curl_slist_free_all(headers);
		err_set(err, errlen, "out of memory starting a download");
		return -1;
	}
	t.curl = curl;
	common_options(curl, o->url, headers);
	curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, on_header);
	curl_easy_setopt(curl, CURLOPT_HEADERDATA, &t);
	curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, on_body);
	curl_easy_setopt(curl, CURLOPT_WRITEDATA, &t);
	curl_easy_setopt(curl, CURLOPT_XFERINFOFUNCTION, on_progress);
	curl_easy_setopt(curl, CURLOPT_XFERINFODATA, &t);
	curl_easy_setopt(curl, CURLOPT_NOPROGRESS, 0L);
	/* The bytes must arrive as stored: no transparent decompression. */
	curl_easy_setopt(curl, CURLOPT_HTTP_CONTENT_DECODING, 0L);
	char range[64];
	if (t.offset > 0) {
		snprintf(range, sizeof range, "%" PRId64 "-", (int64_t)t.offset);
		curl_easy_setopt(curl, CURLOPT_RANGE, range);
		if (o->progress) {
			char h[32];
			fprintf(stderr, "%s: resuming at %s\n", o->label ? o->label : o->dest,
			        human(t.offset, h, sizeof h));
		}
	}
	char curl_msg[CURL_ERROR_SIZE] = "";
	curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, curl_msg);
	prog->start = t.offset;
	prog->t0 = now_seconds();
	CURLcode rc = curl_easy_perform(curl);
	if (!t.decided)
		curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &t.status);
	curl_easy_cleanup(curl);
	curl_slist_free_all(headers);

	curl_off_t have = t.offset + t.received;
	*appended = t.offset > 0; /* decide() zeroes it when the server ignored Range */
	if (rc == CURLE_OK && t.status == 416 && t.offset > 0) {
		progress_end(prog);
		*final_size = t.range_total;
		return 1;
	}
	if (rc == CURLE_OK && t.status != 200 && t.status != 206) {
		progress_end(prog);
		*transient = t.status >= 500 || t.status == 429;
		tidy_body(t.body);
		const char *hint = "";
		if (t.status == 401 || t.status == 403)
			hint = o->bearer_token && *o->bearer_token
			           ? " (the token was refused or has no access)"
			           : " (authentication needed: a token may be required)";
		err_set(err, errlen, "HTTP %ld from %s%s%s%s", t.status, o->url, hint,
		        t.body[0] ? ": " : "", t.body);
		return -1;
	}
	if (rc != CURLE_OK) {
		progress_end(prog);
		/* The network's fault, not ours (t.fail: a write to disk failed,
		 * or the answer was not the file): worth another try. */
		*transient = !t.fail[0];
		const char *why = t.fail[0]     ? t.fail
		                  : curl_msg[0] ? curl_msg
		                                : curl_easy_strerror(rc);
		char h1[32], h2[32];
		if (t.total > 0)
			err_set(err, errlen,
			        "download of %s stopped at %s of %s: %s; what arrived is kept in "
			        "%s.part and the same command resumes from there",
			        o->url, human(have, h1, sizeof h1), human(t.total, h2, sizeof h2),
			        why, o->dest);
		else
			err_set(err, errlen,
			        "download of %s failed after %s: %s; the same command resumes from "
			        "%s.part",
			        o->url, human(have, h1, sizeof h1), why, o->dest);
		return -1;
	}
	if (t.total >= 0 && have != t.total) {
		progress_end(prog);
		*transient = 1;
		err_set(err, errlen,
		        "download of %s ended at %" PRId64 " of %" PRId64
		        " bytes; the same command resumes from %s.part",
		        o->url, (int64_t)have, (int64_t)t.total, o->dest);
		return -1;
	}
	progress_show(prog, have, t.total >= 0 ? t.total : have, 1);
	*final_size = have;
	return 0;
}

int download_file(const struct download_opts *o, char *err, size_t errlen)
{
	if (!o || !o->url || !o->dest) {
		err_set(err, errlen, "download: no URL or destination");
		return -1;
	}
	if (o->expect_sha256 && strlen(o->expect_sha256) != 64) {
		err_set(err, errlen, "download: the expected SHA-256 '%s' is not 64 hex digits",
		        o->expect_sha256);
		return -1;
	}
	if (curl_ready(err, errlen) != 0)
		return -1;
	const char *label = o->label ? o->label : o->dest;

	/* A finished file with the right hash needs nothing. */
	char hex[65];
	if (o->expect_sha256 && access(o->dest, F_OK) == 0) {
		if (sha256_file(o->dest, hex) == 0 && !strcasecmp(hex, o->expect_sha256)) {
			if (o->progress)
				fprintf(stderr, "%s: already downloaded (SHA-256 checked)\n",
				        label);
			return 0;
		}
	}

	size_t plen = strlen(o->dest) + sizeof ".part";
	char *part = malloc(plen);
	EVP_MD_CTX *sha = EVP_MD_CTX_new();
	if (!part || !sha) {
		free(part);
		EVP_MD_CTX_free(sha);
		err_set(err, errlen, "out of memory");
		return -1;
	}
	snprintf(part, plen, "%s.part", o->dest);
	int rc = -1, locked = 0;
	int fd = open(part, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
	if (fd < 0) {
		err_set(err, errlen, "cannot open %s: %s", part, strerror(errno));
		goto out;
	}
	if (plat_lock(fd, 1, 0) != 0) {
		err_set(err, errlen, "%s is being downloaded by another process (%s is locked)",
		        label, part);
		goto out;
	}
	locked = 1;
	struct progress prog = {.enabled = o->progress,
	                        .tty = o->progress && isatty(STDERR_FILENO),
	                        .label = label,
	                        .last_decile = -1};
	/* Two rounds at most: the second starts from zero when a resumed part
	 * turns out not to match (the server's file changed under us). A
	 * transfer the network broke is resumed from what arrived, twice (after
	 * 1 s, then 2 s), before the error asks the user to run it again. */
	int retries = 0;
	for (int round = 0; round < 2; round++) {
		struct stat st;
		if (EVP_DigestInit_ex(sha, EVP_sha256(), NULL) != 1 ||
		    lseek(fd, 0, SEEK_SET) != 0 || hash_fd(fd, sha) != 0) {
			err_set(err, errlen, "cannot read %s: %s", part, strerror(errno));
			goto out;
		}
		curl_off_t size = -1;
		int resumed = 0;
		int transient = 0;
		int got =
		    fetch_into_part(o, fd, sha, &prog, &size, &resumed, &transient, err, errlen);
		if (got < 0 && transient && retries < 2) {
			if (o->progress)
				fprintf(stderr, "%s: %s; trying again\n", label, err);
			sleep(1u << retries);
			retries++;
			round--; /* the same round, resumed */
			continue;
		}
		if (got < 0)
			goto out;
		if (fstat(fd, &st) != 0) {
			err_set(err, errlen, "cannot stat %s: %s", part, strerror(errno));
			goto out;
		}
		if (got == 1 && size >= 0 && st.st_size != size) {
			/* Our part is longer than the file: it is not this file. */
			if (ftruncate(fd, 0) != 0) {
				err_set(err, errlen, "cannot truncate %s: %s", part,
				        strerror(errno));
				goto out;
			}
			continue;
		}
		unsigned char md[EVP_MAX_MD_SIZE];
		unsigned len = 0;
		if (EVP_DigestFinal_ex(sha, md, &len) != 1 || len != 32) {
			err_set(err, errlen, "SHA-256 computation failed");
			goto out;
		}
		bytes_hex(md, len, hex);
		if (o->expect_sha256 && strcasecmp(hex, o->expect_sha256) != 0) {
			if (resumed && round == 0) {
				/* What an earlier attempt left may be of another version
				 * of the file: one fresh download decides. */
				if (o->progress)
					fprintf(stderr,
					        "%s: the resumed download does not match; "
					        "downloading it again from the start\n",
					        label);
				if (ftruncate(fd, 0) != 0) {
					err_set(err, errlen, "cannot truncate %s: %s", part,
					        strerror(errno));
					goto out;
				}
				continue;
			}
			unlink(part);
			err_set(err, errlen,
			        "checksum mismatch for %s: expected SHA-256 %s, got %s; the "
			        "downloaded data was deleted and nothing was installed",
			        label, o->expect_sha256, hex);
			goto out;
		}
		if (fsync(fd) != 0) {
			err_set(err, errlen, "cannot sync %s: %s", part, strerror(errno));
			goto out;
		}
		if (rename(part, o->dest) != 0) {
			err_set(err, errlen, "cannot rename %s to %s: %s", part, o->dest,
			        strerror(errno));
			goto out;
		}
		plat_fsync_dir_of(o->dest);
		rc = 0;
		goto out;
	}
	unlink(part);
	err_set(err, errlen, "download of %s did not settle after a restart; try again", o->url);
out:
	if (fd >= 0) {
		/* An empty leftover (a 404, a refused token) is no resume point. */
		struct stat st;
		if (rc != 0 && locked && fstat(fd, &st) == 0 && st.st_size == 0)
			unlink(part);
		close(fd);
	}
	EVP_MD_CTX_free(sha);
	free(part);
	return rc;
}

/* --- small documents ----------------------------------------------------- */

struct membuf {
	char *data;
	size_t len;
	size_t cap;
	int too_big;
};

static size_t on_mem(char *buf, size_t size, size_t nmemb, void *arg)
{
	struct membuf *m = arg;
	size_t len = size * nmemb;
	if (m->len + len + 1 > MEMORY_LIMIT) {
		m->too_big = 1;
		return 0;
	}
	if (GROW(m->data, m->cap, m->len + len + 1, 16384) != 0)
		return 0;
	memcpy(m->data + m->len, buf, len);
	m->len += len;
	m->data[m->len] = '\0';
	return len;
}

int download_to_memory(const char *url, const char *bearer_token, char **body, size_t *len,
                       long *status, char *err, size_t errlen)
{
	*body = NULL;
	if (len)
		*len = 0;
	if (status)
		*status = 0;
	if (curl_ready(err, errlen) != 0)
		return -1;
	int oom;
	struct curl_slist *headers = common_headers(bearer_token, &oom);
	CURL *curl = oom ? NULL : curl_easy_init();
	if (!curl) {
		curl_slist_free_all(headers);
		err_set(err, errlen, "out of memory");
		return -1;
	}
	struct membuf m = {0};
	char curl_msg[CURL_ERROR_SIZE] = "";
	common_options(curl, url, headers);
	curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, on_mem);
	curl_easy_setopt(curl, CURLOPT_WRITEDATA, &m);
	curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, curl_msg);
	curl_easy_setopt(curl, CURLOPT_ACCEPT_ENCODING, ""); /* API answers compress well */
	CURLcode rc = curl_easy_perform(curl);
	long code = 0;
	curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &code);
	curl_easy_cleanup(curl);
	curl_slist_free_all(headers);
	if (rc != CURLE_OK) {
		free(m.data);
		if (m.too_big)
			err_set(err, errlen, "the answer from %s is larger than %u MiB", url,
			        MEMORY_LIMIT >> 20);
		else
			err_set(err, errlen, "cannot fetch %s: %s", url,
			        curl_msg[0] ? curl_msg : curl_easy_strerror(rc));
		return -1;
	}
	if (!m.data) {
		m.data = malloc(1);
		if (!m.data) {
			err_set(err, errlen, "out of memory");
			return -1;
		}
		m.data[0] = '\0';
	}
	*body = m.data;
	if (len)
		*len = m.len;
	if (status)
		*status = code;
	return 0;
}
