/* The dispatcher's results and routes: result arena mappings, the routes
 * kernels keep, and the counts (dispatch.h). */
#include <sys/mman.h>

#include "dispatch_internal.h"

static int counting_on = 1;  /* pfb_dispatch_set_counting */

/* ------------------------------------------------------------- results -- */

void pfb_dispatch_arena_keep(PfbDispatchArena* arena) {
  __atomic_add_fetch(&arena->refs, 1, SC);
}

void pfb_dispatch_arena_drop(PfbDispatchArena* arena) {
  if (arena == NULL || __atomic_sub_fetch(&arena->refs, 1, SC) != 0) return;
  if (arena->base != NULL) munmap(arena->base, arena->bytes);
  pfb_dispatch_release(arena->d);
  free(arena);
}

void pfb_dispatch_arena_hand_back(PfbDispatchArena* arena, uint64_t offset) {
  Worker* w = &arena->d->workers[arena->index];
  pthread_mutex_lock(&w->back_lock);
  /* Only to the worker that wrote it (lost() clears w->arena under this
   * lock): a later worker in the slot has an arena of its own. */
  if (w->arena == arena) words_push(&w->back, offset);  /* (no memory: the block stays lost) */
  pthread_mutex_unlock(&w->back_lock);
}

uint64_t pfb_dispatch_free_bytes(PfbDispatch* d) {
  pthread_mutex_lock(&d->arena_lock);
  uint64_t n = pfb_arena_free_bytes(d->arena);
  pthread_mutex_unlock(&d->arena_lock);
  return n;
}

/* -------------------------------------------------------------- routes -- */

/* Every route's (dispatch.h, PfbDispatchApi). */
static const PfbDispatchApi api = {
    pfb_dispatch_call,            pfb_dispatch_finish,     pfb_dispatch_arena_keep,
    pfb_dispatch_arena_drop,      pfb_dispatch_arena_hand_back, pfb_dispatch_route_keep,
    pfb_dispatch_route_drop,      pfb_dispatch_reply_hand_back, pfb_dispatch_post,
    pfb_dispatch_abandon,         pfb_dispatch_wait};

PfbDispatchRoute* pfb_dispatch_route_new(PfbDispatch* d, uint64_t token, uint32_t flags) {
  PfbDispatchRoute* route = (PfbDispatchRoute*)malloc(sizeof(PfbDispatchRoute));
  if (route == NULL) return NULL;
  PfbDispatchRoute made = {1, &api, d, token, flags, &counting_on, {0}};
  *route = made;
  pfb_dispatch_retain(d);  /* the route's reference */
  return route;
}

void pfb_dispatch_route_keep(PfbDispatchRoute* route) {
  __atomic_add_fetch(&route->refs, 1, SC);
}

void pfb_dispatch_route_drop(PfbDispatchRoute* route) {
  if (route == NULL || __atomic_sub_fetch(&route->refs, 1, SC) != 0) return;
  pfb_dispatch_release(route->d);
  free(route);
}

void pfb_dispatch_set_counting(int on) { __atomic_store_n(&counting_on, on ? 1 : 0, SC); }

int pfb_dispatch_counting(void) { return __atomic_load_n(&counting_on, SC); }

void pfb_dispatch_counts(PfbDispatch* d, PfbDispatchCounts* out) {
  /* (Every field a uint64_t counter.) */
  uint64_t* from = (uint64_t*)&d->counts;
  for (size_t i = 0; i < sizeof(*out) / sizeof(uint64_t); ++i)
    ((uint64_t*)out)[i] = __atomic_load_n(&from[i], SC);
}
