/* experts_local.h - the in-process expert backend (--workers 0): calls the
 * workers/ library directly on experts mapped from the checkpoint. Each needed
 * expert is computed once per call for all of its tokens (prefill by expert). */
#ifndef K3_EXPERTS_LOCAL_H
#define K3_EXPERTS_LOCAL_H

#include "coordinator/expert_backend.h"
#include "coordinator/model.h"

/* The backend borrows m and k; both must outlive it. */
int experts_local_create(expert_backend *b, k3_model *m, const kernels *k, k3_error *err);

#endif
