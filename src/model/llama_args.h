/* llama-server's own arguments, read as llama-server reads them. Its parser
 * turns the underscores of a long option into dashes ("--cache_type_k" is
 * "--cache-type-k"), so every place toki looks at a user's server arguments
 * (the context it sizes, the threads it counts, the KV settings its saved
 * states are fingerprinted by) must too, or it reads a server other than the
 * one that runs. */
#ifndef TOKI_LLAMA_ARGS_H
#define TOKI_LLAMA_ARGS_H

/* 1 when the argument arg names the option name (written with dashes, as
 * llama-server's help lists it). */
int llama_arg_is(const char *arg, const char *name);

#endif
