/* The Hugging Face hub API: repository listings and choosing GGUFs (hub.h). */
#include "model/hub.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <strings.h>

#include <curl/curl.h>
#include <jansson.h>

#include "util/err.h"
#include "util/grow.h"

#ifndef TOKI_VERSION
#define TOKI_VERSION "dev"
#endif

/* A listing page is JSON of a few hundred bytes per file; a repository with
 * tens of thousands of files is not a model repository we can help with. */
#define PAGE_LIMIT (32u << 20)
#define MAX_PAGES 100

const char *hub_endpoint(void)
{
	static char buf[1024];
	const char *e = getenv("HF_ENDPOINT");
	if (!e || !*e)
		return HUB_DEFAULT_ENDPOINT;
	snprintf(buf, sizeof buf, "%s", e);
	size_t n = strlen(buf);
	while (n > 1 && buf[n - 1] == '/')
		buf[--n] = '\0';
	return buf;
}

static int name_part_ok(const char *s, size_t n)
{
	if (n == 0 || n > 96 || (n == 1 && s[0] == '.') || (n == 2 && s[0] == '.' && s[1] == '.'))
		return 0;
	for (size_t i = 0; i < n; i++)
		if (!isalnum((unsigned char)s[i]) && s[i] != '.' && s[i] != '_' && s[i] != '-')
			return 0;
	return 1;
}

int hub_repo_is_valid(const char *repo)
{
	const char *slash = strchr(repo, '/');
	if (!slash || strchr(slash + 1, '/'))
		return 0;
	return name_part_ok(repo, (size_t)(slash - repo)) &&
	       name_part_ok(slash + 1, strlen(slash + 1));
}

/* Percent-encodes s into out at *o; keep_slash leaves '/' as is (paths). */
static int encode(const char *s, int keep_slash, char *out, size_t n, size_t *o)
{
	static const char hex[] = "0123456789ABCDEF";
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;
		int plain = isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~' ||
		            (keep_slash && c == '/');
		size_t need = plain ? 1 : 3;
		if (*o + need >= n)
			return -1;
		if (plain) {
			out[(*o)++] = (char)c;
		} else {
			out[(*o)++] = '%';
			out[(*o)++] = hex[c >> 4];
			out[(*o)++] = hex[c & 15];
		}
	}
	out[*o] = '\0';
	return 0;
}

static int append(const char *s, char *out, size_t n, size_t *o)
{
	size_t l = strlen(s);
	if (*o + l >= n)
		return -1;
	memcpy(out + *o, s, l + 1);
	*o += l;
	return 0;
}

int hub_resolve_url(const char *endpoint, const char *repo, const char *revision, const char *path,
                    char *out, size_t n)
{
	size_t o = 0;
	if (!n)
		return -1;
	out[0] = '\0';
	if (append(endpoint, out, n, &o) || append("/", out, n, &o) || append(repo, out, n, &o) ||
	    append("/resolve/", out, n, &o) || encode(revision, 0, out, n, &o) ||
	    append("/", out, n, &o) || encode(path, 1, out, n, &o))
		return -1;
	return 0;
}

/* --- listing ------------------------------------------------------------- */

struct page {
	char *data;
	size_t len, cap;
	int too_big;
	char next[4096]; /* from Link: rel="next", or "" */
};

static size_t on_page(char *buf, size_t size, size_t nmemb, void *arg)
{
	struct page *p = arg;
	size_t len = size * nmemb;
	if (p->len + len + 1 > PAGE_LIMIT) {
		p->too_big = 1;
		return 0;
	}
	if (GROW(p->data, p->cap, p->len + len + 1, 65536) != 0)
		return 0;
	memcpy(p->data + p->len, buf, len);
	p->len += len;
	p->data[p->len] = '\0';
	return len;
}

/* Link: <url1>; rel="next", <url2>; rel="last" (the GitHub convention). */
static size_t on_page_header(char *buf, size_t size, size_t nitems, void *arg)
{
	struct page *p = arg;
	size_t len = size * nitems;
	if (len >= 5 && !strncmp(buf, "HTTP/", 5)) {
		p->next[0] = '\0';
		return len;
	}
	if (len < 6 || strncasecmp(buf, "Link:", 5) != 0)
		return len;
	char line[8192];
	size_t l = len < sizeof line - 1 ? len : sizeof line - 1;
	memcpy(line, buf + 5, l - 5);
	line[l - 5] = '\0';
	for (char *lt = strchr(line, '<'); lt; lt = strchr(lt + 1, '<')) {
		char *gt = strchr(lt, '>');
		if (!gt)
			break;
		char *comma = strchr(gt, ',');
		char *rel = strstr(gt, "rel=\"next\"");
		if (rel && (!comma || rel < comma) && (size_t)(gt - lt - 1) < sizeof p->next) {
			memcpy(p->next, lt + 1, (size_t)(gt - lt - 1));
			p->next[gt - lt - 1] = '\0';
			break;
		}
		lt = gt;
	}
	return len;
}

static int get_page_once(const char *url, const char *token, struct page *p, long *status,
                         char *err, size_t errlen)
{
	CURL *curl = curl_easy_init();
	if (!curl) {
		err_set(err, errlen, "cannot start libcurl");
		return -1;
	}
	struct curl_slist *h = NULL;
	char auth[2048];
	if (token && *token) {
		if ((size_t)snprintf(auth, sizeof auth, "Authorization: Bearer %s", token) >=
		    sizeof auth) {
			curl_easy_cleanup(curl);
			err_set(err, errlen, "HF_TOKEN is too long");
			return -1;
		}
		h = curl_slist_append(h, auth);
		memset(auth, 0, sizeof auth);
	}
	struct curl_slist *h2 = curl_slist_append(h, "Accept: application/json");
	if (h2)
		h = h2;
	char msg[CURL_ERROR_SIZE] = "";
	curl_easy_setopt(curl, CURLOPT_URL, url);
	curl_easy_setopt(curl, CURLOPT_HTTPHEADER, h);
	curl_easy_setopt(curl, CURLOPT_FOLLOWLOCATION, 1L);
	curl_easy_setopt(curl, CURLOPT_MAXREDIRS, 10L);
	curl_easy_setopt(curl, CURLOPT_USERAGENT, "toki/" TOKI_VERSION);
	curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT, 30L);
	curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, 1L);
	curl_easy_setopt(curl, CURLOPT_LOW_SPEED_TIME, 60L);
	curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
	curl_easy_setopt(curl, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
	curl_easy_setopt(curl, CURLOPT_ACCEPT_ENCODING, "");
	curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, on_page);
	curl_easy_setopt(curl, CURLOPT_WRITEDATA, p);
	curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, on_page_header);
	curl_easy_setopt(curl, CURLOPT_HEADERDATA, p);
	curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, msg);
	CURLcode rc = curl_easy_perform(curl);
	curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, status);
	curl_easy_cleanup(curl);
	curl_slist_free_all(h);
	if (rc != CURLE_OK) {
		if (p->too_big)
			err_set(err, errlen, "the listing from %s is larger than %u MiB", url,
			        PAGE_LIMIT >> 20);
		else
			err_set(err, errlen, "cannot reach the hub at %s: %s", url,
			        msg[0] ? msg : curl_easy_strerror(rc));
		return -1;
	}
	return 0;
}

/* A listing page, asked again (after 1 s, then 2 s) when the hub did not
 * answer or answered 5xx or 429: hubs and proxies drop a request now and
 * then, and a pull should not fail for it. */
static int get_page(const char *url, const char *token, struct page *p, long *status, char *err,
                    size_t errlen)
{
	for (int attempt = 0;; attempt++) {
		*status = 0;
		int rc = get_page_once(url, token, p, status, err, errlen);
		int transient =
		    (rc != 0 && !p->too_big) || (rc == 0 && (*status >= 500 || *status == 429));
		if (!transient || attempt == 2)
			return rc;
		free(p->data);
		memset(p, 0, sizeof *p);
		sleep(1u << attempt);
	}
}

static int is_hex64(const char *s)
{
	if (strlen(s) != 64)
		return 0;
	for (int i = 0; i < 64; i++)
		if (!isxdigit((unsigned char)s[i]))
			return 0;
	return 1;
}

static int add_entries(json_t *arr, struct hub_listing *out, char *err, size_t errlen)
{
	size_t i;
	json_t *e;
	json_array_foreach(arr, i, e)
	{
		const char *type = json_string_value(json_object_get(e, "type"));
		const char *path = json_string_value(json_object_get(e, "path"));
		if (!type || !path || strcmp(type, "file") != 0)
			continue;
		struct hub_file *f = realloc(out->files, (out->n + 1) * sizeof *f);
		if (!f) {
			err_set(err, errlen, "out of memory");
			return -1;
		}
		out->files = f;
		f = &out->files[out->n];
		memset(f, 0, sizeof *f);
		f->path = strdup(path);
		if (!f->path) {
			err_set(err, errlen, "out of memory");
			return -1;
		}
		out->n++;
		json_t *size = json_object_get(e, "size");
		f->size = json_is_integer(size) ? (long long)json_integer_value(size) : -1;
		json_t *lfs = json_object_get(e, "lfs");
		const char *oid = json_string_value(json_object_get(lfs, "oid"));
		if (oid && !strncmp(oid, "sha256:", 7))
			oid += 7;
		if (oid && is_hex64(oid)) {
			for (int k = 0; k < 64; k++)
				f->sha256[k] = (char)tolower((unsigned char)oid[k]);
			f->sha256[64] = '\0';
			json_t *lsize = json_object_get(lfs, "size");
			if (json_is_integer(lsize))
				f->size = (long long)json_integer_value(lsize);
		}
	}
	return 0;
}

/* The hub's error answers are {"error": "..."}; other servers send text. */
static void answer_message(const char *body, char *out, size_t n)
{
	out[0] = '\0';
	if (!body)
		return;
	json_t *j = json_loads(body, 0, NULL);
	const char *m = json_string_value(json_object_get(j, "error"));
	snprintf(out, n, "%s", m ? m : body);
	json_decref(j);
	for (char *p = out; *p; p++)
		if ((unsigned char)*p < 0x20)
			*p = ' ';
	if (strlen(out) > 200)
		strcpy(out + 197, "...");
}

int hub_list_files(const char *endpoint, const char *repo, const char *revision, const char *token,
                   struct hub_listing *out, char *err, size_t errlen)
{
	memset(out, 0, sizeof *out);
	if (!hub_repo_is_valid(repo)) {
		err_set(err, errlen, "'%s' is not a repository name of the form org/name", repo);
		return -1;
	}
	if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
		err_set(err, errlen, "cannot initialise libcurl");
		return -1;
	}
	char url[4096];
	size_t o = 0;
	url[0] = '\0';
	if (append(endpoint, url, sizeof url, &o) || append("/api/models/", url, sizeof url, &o) ||
	    append(repo, url, sizeof url, &o) || append("/tree/", url, sizeof url, &o) ||
	    encode(revision, 0, url, sizeof url, &o) ||
	    append("?recursive=true", url, sizeof url, &o)) {
		err_set(err, errlen, "the listing URL is too long");
		return -1;
	}
	for (int pages = 0; pages < MAX_PAGES; pages++) {
		struct page p = {0};
		long status = 0;
		if (get_page(url, token, &p, &status, err, errlen) != 0) {
			free(p.data);
			goto fail;
		}
		if (status != 200) {
			char msg[256];
			answer_message(p.data, msg, sizeof msg);
			free(p.data);
			if (status == 401 || status == 403) {
				if (token && *token)
					err_set(err, errlen,
					        "the hub refused access to %s (HTTP %ld: %s): the "
					        "token in HF_TOKEN has no access to it (a gated "
					        "model must be accepted on its page first)",
					        repo, status, msg);
				else
					err_set(
					    err, errlen,
					    "the hub refused access to %s (HTTP %ld: %s): it is "
					    "private or gated; set HF_TOKEN to a token that has "
					    "access",
					    repo, status, msg);
			} else if (status == 404) {
				err_set(err, errlen,
				        "no repository %s with revision %s at %s (HTTP 404: %s)%s",
				        repo, revision, endpoint, msg,
				        token && *token ? "" : "; a private one needs HF_TOKEN");
			} else {
				err_set(err, errlen, "listing %s at %s failed: HTTP %ld: %s", repo,
				        endpoint, status, msg);
			}
			goto fail;
		}
		json_error_t je;
		json_t *arr = json_loads(p.data ? p.data : "", 0, &je);
		free(p.data);
		if (!json_is_array(arr)) {
			json_decref(arr);
			err_set(err, errlen,
			        "the hub's listing of %s is not a JSON array (%s); is %s a Hugging "
			        "Face endpoint?",
			        repo, je.text[0] ? je.text : "wrong type", endpoint);
			goto fail;
		}
		int rc = add_entries(arr, out, err, errlen);
		json_decref(arr);
		if (rc != 0)
			goto fail;
		if (!p.next[0])
			return 0;
		/* The token goes with every request: follow pages on the same
		 * endpoint only. */
		size_t el = strlen(endpoint);
		if (strncmp(p.next, endpoint, el) != 0 ||
		    (p.next[el] != '/' && p.next[el] != '\0')) {
			err_set(err, errlen,
			        "the hub's next page %s is not on %s; refusing to follow", p.next,
			        endpoint);
			goto fail;
		}
		snprintf(url, sizeof url, "%s", p.next);
	}
	err_set(err, errlen, "%s has more than %d pages of files; giving up", repo, MAX_PAGES);
fail:
	hub_listing_free(out);
	return -1;
}

void hub_listing_free(struct hub_listing *l)
{
	for (size_t i = 0; i < l->n; i++)
		free(l->files[i].path);
	free(l->files);
	l->files = NULL;
	l->n = 0;
}

/* --- choosing ------------------------------------------------------------ */

static const char *base_of(const char *path)
{
	const char *s = strrchr(path, '/');
	return s ? s + 1 : path;
}

static int ends_with_gguf(const char *s)
{
	size_t n = strlen(s);
	return n > 5 && !strcasecmp(s + n - 5, ".gguf");
}

int hub_split_shard(const char *path, int *index, int *count, char *prefix, size_t n)
{
	/* "-NNNNN-of-MMMMM.gguf" is 20 characters. */
	size_t len = strlen(path);
	if (len <= 20 || !ends_with_gguf(path))
		return 0;
	const char *s = path + len - 20;
	if (s < base_of(path))
		return 0;
	int a = 0, b = 0;
	if (s[0] != '-' || strncmp(s + 6, "-of-", 4) != 0)
		return 0;
	for (int i = 1; i <= 5; i++) {
		if (!isdigit((unsigned char)s[i]) || !isdigit((unsigned char)s[i + 9]))
			return 0;
		a = a * 10 + (s[i] - '0');
		b = b * 10 + (s[i + 9] - '0');
	}
	if (a < 1 || b < 1 || a > b)
		return 0;
	*index = a;
	*count = b;
	if (prefix && n) {
		size_t k = (size_t)(s - path);
		if (k >= n)
			k = n - 1;
		memcpy(prefix, path, k);
		prefix[k] = '\0';
	}
	return 1;
}

/* One model: a single GGUF, or the shards of a split one. */
struct group {
	char key[1024]; /* the path, or the split prefix */
	int split;
	int count;     /* shards the names announce */
	size_t *files; /* listing indexes, by shard number (SIZE_MAX: missing) */
	int nfiles;
	int projector; /* an mmproj file: never chosen by quant */
};

static void groups_free(struct group *g, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(g[i].files);
	free(g);
}

static int build_groups(const struct hub_listing *l, struct group **out, size_t *nout)
{
	struct group *g = NULL;
	size_t n = 0;
	for (size_t i = 0; i < l->n; i++) {
		const char *path = l->files[i].path;
		if (!ends_with_gguf(path))
			continue;
		char key[1024];
		int idx = 1, cnt = 1;
		int split = hub_split_shard(path, &idx, &cnt, key, sizeof key);
		if (!split)
			snprintf(key, sizeof key, "%s", path);
		size_t k;
		for (k = 0; k < n; k++)
			if (g[k].split == split && g[k].count == cnt && !strcmp(g[k].key, key))
				break;
		if (k == n) {
			struct group *ng = realloc(g, (n + 1) * sizeof *g);
			if (!ng)
				goto oom;
			g = ng;
			memset(&g[n], 0, sizeof g[n]);
			snprintf(g[n].key, sizeof g[n].key, "%s", key);
			g[n].split = split;
			g[n].count = cnt;
			g[n].projector = !strncasecmp(base_of(path), "mmproj", 6);
			g[n].files = malloc((size_t)cnt * sizeof(size_t));
			if (!g[n].files)
				goto oom;
			for (int s = 0; s < cnt; s++)
				g[n].files[s] = (size_t)-1;
			n++;
		}
		if (g[k].files[idx - 1] == (size_t)-1)
			g[k].nfiles++;
		g[k].files[idx - 1] = i;
	}
	*out = g;
	*nout = n;
	return 0;
oom:
	groups_free(g, n);
	return -1;
}

/* "a.gguf, b-00001-of-00002.gguf (2 files), ..." into out. */
static void list_groups(const struct hub_listing *l, const struct group *g, size_t n,
                        const size_t *which, size_t nwhich, char *out, size_t size)
{
	size_t o = 0;
	out[0] = '\0';
	size_t count = which ? nwhich : n;
	for (size_t j = 0; j < count && o + 1 < size; j++) {
		const struct group *x = &g[which ? which[j] : j];
		const char *first = NULL;
		for (int s = 0; s < x->count && !first; s++)
			if (x->files[s] != (size_t)-1)
				first = l->files[x->files[s]].path;
		int w;
		if (x->split)
			w = snprintf(out + o, size - o, "%s%s (%d files)", j ? ", " : "", first,
			             x->count);
		else
			w = snprintf(out + o, size - o, "%s%s", j ? ", " : "", first);
		if (w < 0 || (size_t)w >= size - o) {
			if (size > 4)
				strcpy(out + size - 4, "...");
			return;
		}
		o += (size_t)w;
	}
	if (!count)
		snprintf(out, size, "(none)");
}

static int pick_group(const struct hub_listing *l, const struct group *x, size_t **picked,
                      size_t *npicked, char *err, size_t errlen)
{
	if (x->nfiles != x->count) {
		char missing[512];
		size_t o = 0;
		missing[0] = '\0';
		for (int s = 0; s < x->count && o < sizeof missing - 16; s++)
			if (x->files[s] == (size_t)-1)
				o += (size_t)snprintf(missing + o, sizeof missing - o, "%s%05d",
				                      o ? ", " : "", s + 1);
		err_set(err, errlen,
		        "%s is split into %d files but the repository lacks shard(s) %s of them",
		        x->key, x->count, missing);
		return -1;
	}
	*picked = malloc((size_t)x->count * sizeof **picked);
	if (!*picked) {
		err_set(err, errlen, "out of memory");
		return -1;
	}
	for (int s = 0; s < x->count; s++)
		(*picked)[s] = x->files[s];
	*npicked = (size_t)x->count;
	(void)l;
	return 0;
}

/* Case-insensitive search; *bounded is set when the match stands alone as a
 * name part (not inside a longer quant name: Q4_0 in IQ4_0, Q4_K in Q4_K_M). */
static int contains_quant(const char *hay, const char *needle, int *bounded)
{
	size_t nl = strlen(needle);
	int found = 0;
	*bounded = 0;
	for (const char *p = hay; *p; p++) {
		if (strncasecmp(p, needle, nl) != 0)
			continue;
		found = 1;
		char before = p == hay ? '/' : p[-1];
		char after = p[nl];
		if (!isalnum((unsigned char)before) && before != '_' &&
		    !isalnum((unsigned char)after) && after != '_')
			*bounded = 1;
	}
	return found;
}

int hub_choose(const struct hub_listing *l, const char *file, const char *quant, size_t **picked,
               size_t *npicked, char *err, size_t errlen)
{
	*picked = NULL;
	*npicked = 0;
	struct group *g = NULL;
	size_t n = 0;
	if (build_groups(l, &g, &n) != 0) {
		err_set(err, errlen, "out of memory");
		return -1;
	}
	int rc = -1;
	char list[2048];
	size_t *match = malloc((n ? n : 1) * sizeof *match);
	if (!match) {
		err_set(err, errlen, "out of memory");
		goto out;
	}
	size_t nm = 0;
	if (file) {
		if (!ends_with_gguf(file)) {
			err_set(err, errlen, "%s is not a .gguf file", file);
			goto out;
		}
		/* An exact path first, then a basename that only one path has. */
		for (int pass = 0; pass < 2 && !nm; pass++)
			for (size_t k = 0; k < n; k++)
				for (int s = 0; s < g[k].count; s++) {
					size_t i = g[k].files[s];
					if (i == (size_t)-1)
						continue;
					const char *p = l->files[i].path;
					if (pass == 0 ? !strcmp(p, file)
					              : !strcmp(base_of(p), base_of(file))) {
						if (!nm || match[nm - 1] != k)
							match[nm++] = k;
					}
				}
		if (nm == 1) {
			rc = pick_group(l, &g[match[0]], picked, npicked, err, errlen);
			goto out;
		}
		if (nm > 1) {
			list_groups(l, g, n, match, nm, list, sizeof list);
			err_set(
			    err, errlen,
			    "%s names more than one file in the repository; give its full path: "
			    "%s",
			    file, list);
			goto out;
		}
		list_groups(l, g, n, NULL, 0, list, sizeof list);
		err_set(err, errlen, "the repository has no file %s; its GGUF files: %s", file,
		        list);
		goto out;
	}
	if (quant) {
		size_t nb = 0;
		size_t *bounded = malloc((n ? n : 1) * sizeof *bounded);
		if (!bounded) {
			err_set(err, errlen, "out of memory");
			goto out;
		}
		for (size_t k = 0; k < n; k++) {
			int b;
			if (g[k].projector || !contains_quant(g[k].key, quant, &b))
				continue;
			match[nm++] = k;
			if (b)
				bounded[nb++] = k;
		}
		/* Several substring matches but one whole-word one: that one. */
		if (nm > 1 && nb == 1) {
			match[0] = bounded[0];
			nm = 1;
		}
		free(bounded);
		if (nm == 1) {
			rc = pick_group(l, &g[match[0]], picked, npicked, err, errlen);
			goto out;
		}
		if (nm > 1) {
			list_groups(l, g, n, match, nm, list, sizeof list);
			err_set(
			    err, errlen,
			    "quant %s matches more than one model: %s; give a longer --quant or "
			    "--file",
			    quant, list);
			goto out;
		}
		list_groups(l, g, n, NULL, 0, list, sizeof list);
		err_set(err, errlen,
		        "no GGUF in the repository matches quant %s; its GGUF files: %s", quant,
		        list);
		goto out;
	}
	for (size_t k = 0; k < n; k++)
		if (!g[k].projector)
			match[nm++] = k;
	if (nm == 1) {
		rc = pick_group(l, &g[match[0]], picked, npicked, err, errlen);
		goto out;
	}
	if (nm == 0) {
		err_set(err, errlen, "the repository has no GGUF files");
		goto out;
	}
	list_groups(l, g, n, match, nm, list, sizeof list);
	err_set(err, errlen, "the repository has %zu models; choose one with --quant or --file: %s",
	        nm, list);
out:
	free(match);
	groups_free(g, n);
	return rc;
}

void hub_default_name(const char *path, char *out, size_t n)
{
	if (!n)
		return;
	char stem[1024];
	int idx, cnt;
	if (!hub_split_shard(path, &idx, &cnt, stem, sizeof stem))
		snprintf(stem, sizeof stem, "%s", path);
	const char *b = base_of(stem);
	size_t len = strlen(b);
	if (len > 5 && !strcasecmp(b + len - 5, ".gguf"))
		len -= 5;
	size_t o = 0;
	for (size_t i = 0; i < len && o + 1 < n && o < 128; i++) {
		char c = b[i];
		out[o++] = isalnum((unsigned char)c) || c == '.' || c == '_' || c == '-' ? c : '-';
	}
	out[o] = '\0';
	if (!o || !strcmp(out, ".") || !strcmp(out, ".."))
		snprintf(out, n, "model");
}
