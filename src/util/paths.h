/* Where toki keeps things. Every path comes from here so that the
 * environment variables that move them are honoured everywhere.
 *   registry:  $TOKI_MODEL_REGISTRY, else $XDG_CONFIG_HOME/tokirecur/models.yaml,
 *              else ~/.config/tokirecur/models.yaml
 *   state:     $TOKI_STATE_DIR, else $XDG_STATE_HOME/tokirecur, else
 *              ~/.local/state/tokirecur (logs, pid files, installed llama.cpp
 *              builds, effective context, the local token)
 * Each returns 0, or -1 with out set to "" when the path does not fit. */
#ifndef TOKI_PATHS_H
#define TOKI_PATHS_H

#include <stddef.h>

int paths_registry_file(char *out, size_t n);
int paths_config_dir(char *out, size_t n);
int paths_state_dir(char *out, size_t n);
/* $state/<sub> (sub may contain slashes). */
int paths_state_sub(char *out, size_t n, const char *sub);
/* mkdir -p with the given mode for the directories it creates. */
int paths_mkdir_p(const char *dir, unsigned mode);
/* A name usable as one path component: [A-Za-z0-9._-], not "." or "..",
 * at most 128 bytes. Model and build names from users, registries or
 * requests must pass this before they become paths. */
int paths_is_safe_name(const char *name);

#endif
