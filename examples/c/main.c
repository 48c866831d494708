/* The C example of docs/embedding.md: open an artifact, list its inputs and outputs with the
 * names of their dims, run it on inputs read from raw little-endian files, and print each
 * output's first values.
 *
 *   cc examples/c/main.c -I capi/include -L target/release -lmeshcrt -o meshc-example
 *   ./meshc-example model.mshc x=x.bin
 *
 * A second session on the same model, calls from two threads at once, and the refusals of a
 * NULL handle, of a misnamed input and of a freed handle are checked too (exit 1 on
 * anything unexpected). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meshc.h"

#define CHECK(call)                                                              \
    do {                                                                         \
        meshc_status s_ = (call);                                                \
        if (s_ != MESHC_OK) {                                                    \
            fprintf(stderr, "%s: status %d: %s\n", #call, s_, meshc_last_error()); \
            exit(1);                                                             \
        }                                                                        \
    } while (0)

static size_t elem_size(meshc_dtype d) {
    switch (d) {
    case MESHC_I64: return 8;
    case MESHC_BOOL: return 1;
    case MESHC_F16: case MESHC_BF16: return 2;
    default: return 4;
    }
}

static size_t nbytes(const meshc_tensor_info *t) {
    size_t n = elem_size(t->dtype);
    for (size_t i = 0; i < t->rank; i++) n *= t->shape[i];
    return n;
}

/* Prints the names the graph gives the dims of input or output k, `_` for an unnamed one:
 * `, dims (batch, _)` and the end of the line. The strings are the model's: nothing to free. */
static void print_dims(const meshc_model *model, int is_out, size_t k, size_t rank) {
    printf(", dims (");
    for (size_t d = 0; d < rank; d++) {
        const char *name;
        CHECK(meshc_model_dim_name(model, is_out, k, d, &name));
        printf("%s%s", d ? ", " : "", name ? name : "_");
    }
    printf(")\n");
}

/* Everything a run needs, shared by the threads. */
struct call {
    meshc_session *session;
    meshc_tensor *in, *out;
    size_t n_in, n_out;
    meshc_status status;
};

static void *run(void *arg) {
    struct call *c = arg;
    for (int i = 0; i < 20 && c->status == MESHC_OK; i++)
        c->status = meshc_session_run(c->session, c->in, c->n_in, c->out, c->n_out);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL.mshc [NAME=FILE.bin]...\n", argv[0]);
        return 1;
    }
    meshc_model *model;
    CHECK(meshc_model_open(argv[1], &model));
    size_t n_in, n_out;
    CHECK(meshc_model_counts(model, &n_in, &n_out));
    meshc_tensor *in = calloc(n_in, sizeof *in), *out = calloc(n_out, sizeof *out);
    for (size_t i = 0; i < n_in + n_out; i++) {
        int is_out = i >= n_in;
        size_t k = is_out ? i - n_in : i;
        meshc_tensor_info info;
        CHECK(meshc_model_tensor(model, is_out, k, &info));
        printf("%s %s: dtype %d, rank %zu, %zu bytes", is_out ? "output" : "input", info.name, info.dtype,
               info.rank, nbytes(&info));
        print_dims(model, is_out, k, info.rank);
        meshc_tensor *t = is_out ? &out[k] : &in[k];
        *t = (meshc_tensor){info.name, info.dtype, info.rank, info.shape, calloc(1, nbytes(&info) + 1)};
        if (is_out) continue;
        /* NAME=FILE: the input's raw bytes. */
        for (int a = 2; a < argc; a++) {
            size_t len = strlen(info.name);
            if (strncmp(argv[a], info.name, len) || argv[a][len] != '=') continue;
            FILE *f = fopen(argv[a] + len + 1, "rb");
            if (!f || fread(t->data, 1, nbytes(&info), f) != nbytes(&info)) {
                fprintf(stderr, "%s: cannot read %zu bytes\n", argv[a], nbytes(&info));
                return 1;
            }
            fclose(f);
        }
    }
    meshc_session *session;
    CHECK(meshc_session_new(model, &session));
    CHECK(meshc_session_run(session, in, n_in, out, n_out));
    for (size_t k = 0; k < n_out; k++)
        if (out[k].dtype == MESHC_F32) {
            const float *v = out[k].data;
            printf("%s = [%g, %g, ...]\n", out[k].name, v[0], v[1]);
        }

    /* Two threads on one session, and a second session: the same answer each time. */
    meshc_tensor_info o0;
    CHECK(meshc_model_tensor(model, 1, 0, &o0));
    void *want = malloc(nbytes(&o0));
    memcpy(want, out[0].data, nbytes(&o0));
    meshc_session *second;
    CHECK(meshc_session_new(model, &second));
    struct call calls[2] = {{session, in, out, n_in, n_out, MESHC_OK}, {second, in, NULL, n_in, 0, MESHC_OK}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, run, &calls[i]);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < 2; i++)
        if (calls[i].status != MESHC_OK) {
            fprintf(stderr, "thread %d: %s\n", i, meshc_last_error());
            return 1;
        }
    if (memcmp(want, out[0].data, nbytes(&o0))) {
        fprintf(stderr, "threads changed the answer\n");
        return 1;
    }

    /* Refusals: a NULL handle, a misnamed input. */
    if (meshc_session_run(NULL, in, n_in, out, n_out) != MESHC_NULL) return 1;
    printf("NULL session: %s\n", meshc_last_error());
    if (n_in > 0) {
        const char *name = in[0].name;
        in[0].name = "no_such_input";
        if (meshc_session_run(session, in, n_in, out, n_out) != MESHC_MISMATCH) return 1;
        printf("misnamed input: %s\n", meshc_last_error());
        in[0].name = name;
    }

    meshc_session_free(session);
    meshc_session_free(second);
    /* A freed handle is refused, not read; freeing it again does nothing. */
    if (meshc_session_run(second, in, n_in, out, n_out) != MESHC_CLOSED) return 1;
    printf("freed session: %s\n", meshc_last_error());
    meshc_session_free(second);
    /* Last: the names and shapes in the tensors above are the model's. */
    meshc_model_free(model);
    for (size_t k = 0; k < n_in; k++) free(in[k].data);
    for (size_t k = 0; k < n_out; k++) free(out[k].data);
    free(in);
    free(out);
    free(want);
    printf("ok\n");
    return 0;
}
