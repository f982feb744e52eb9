/* POST /lora-adapters: a change of the servers' LoRA adapter scales. */
#ifndef TOKI_SERVE_ADAPTERS_H
#define TOKI_SERVE_ADAPTERS_H

struct daemon;
struct http_request;

/* GET passes through; POST goes to every backend that is up, none of them
 * running a request (409 otherwise), each held out of routing until it
 * answers and then discovered again (backend_rediscover). */
void adapters_route(struct daemon *d, struct http_request *req);

#endif
