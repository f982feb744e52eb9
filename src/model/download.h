/* Downloads over HTTP(S) with libcurl: resumable, checked, atomic.
 * Data goes to <dest>.part; an interrupted download resumes from there with a
 * Range request; the finished file is checked against the expected SHA-256,
 * fsynced and renamed to <dest>. A mismatch deletes the partial file and
 * leaves <dest> untouched. */
#ifndef TOKI_DOWNLOAD_H
#define TOKI_DOWNLOAD_H

#include <stddef.h>

struct download_opts {
	const char *url;
	const char *dest;	   /* final path */
	const char *expect_sha256; /* lowercase hex, or NULL to skip the check */
	const char *bearer_token;  /* sent as Authorization: Bearer (HF_TOKEN), or NULL */
	const char *label;	   /* shown beside the progress bar */
	int progress;		   /* 1: a progress bar on stderr when it is a terminal, else
				      a line every 10%; 0: quiet */
};

/* 0, or -1 with a message in err. */
int download_file(const struct download_opts *o, char *err, size_t errlen);

/* GETs a (small) document into memory, e.g. a JSON API answer. *body is
 * NUL-terminated and owned by the caller. Returns 0 when the transfer
 * worked (whatever the HTTP status, which goes to *status), or -1. */
int download_to_memory(const char *url, const char *bearer_token, char **body, size_t *len,
		       long *status, char *err, size_t errlen);

/* The SHA-256 of a file, as 64 lowercase hex digits and a NUL. */
int sha256_file(const char *path, char hex[65]);

#endif
