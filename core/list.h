/* SPDX-License-Identifier: Apache-2.0 */
/* list.h - intrusive doubly linked list (as nng's nni_list). */
#ifndef TP_CORE_LIST_H
#define TP_CORE_LIST_H

#include <stdbool.h>
#include <stddef.h>

typedef struct tp_list_node {
    struct tp_list_node *ln_next;
    struct tp_list_node *ln_prev;
} tp_list_node;

typedef struct tp_list {
    tp_list_node l_head; // sentinel
    size_t l_offset;     // offset of the node inside an item
} tp_list;

#define TP_LIST_INIT(list, type, member)                                       \
    tp__list_init_offset(list, offsetof(type, member))

static inline void
tp__list_init_offset(tp_list *l, size_t off)
{
    l->l_head.ln_next = &l->l_head;
    l->l_head.ln_prev = &l->l_head;
    l->l_offset = off;
}

static inline void
tp__list_node_init(tp_list_node *n)
{
    n->ln_next = NULL;
    n->ln_prev = NULL;
}

static inline bool
tp__list_node_active(const tp_list_node *n)
{
    return n->ln_next != NULL;
}

static inline bool
tp__list_empty(const tp_list *l)
{
    return l->l_head.ln_next == &l->l_head;
}

static inline void *
tp__list_item(const tp_list *l, tp_list_node *n)
{
    return n == &l->l_head ? NULL : (void *)((char *)n - l->l_offset);
}

static inline tp_list_node *
tp__list_node(const tp_list *l, void *item)
{
    return (tp_list_node *)(void *)((char *)item + l->l_offset);
}

static inline void *
tp__list_first(const tp_list *l)
{
    return tp__list_item(l, l->l_head.ln_next);
}

static inline void *
tp__list_last(const tp_list *l)
{
    return tp__list_item(l, l->l_head.ln_prev);
}

static inline void *
tp__list_next(const tp_list *l, void *item)
{
    return tp__list_item(l, tp__list_node(l, item)->ln_next);
}

static inline void
tp__list_insert_before(tp_list_node *where, tp_list_node *n)
{
    n->ln_next = where;
    n->ln_prev = where->ln_prev;
    where->ln_prev->ln_next = n;
    where->ln_prev = n;
}

static inline void
tp__list_append(tp_list *l, void *item)
{
    tp__list_insert_before(&l->l_head, tp__list_node(l, item));
}

static inline void
tp__list_prepend(tp_list *l, void *item)
{
    tp__list_insert_before(l->l_head.ln_next, tp__list_node(l, item));
}

static inline void
tp__list_remove(tp_list *l, void *item)
{
    tp_list_node *n = tp__list_node(l, item);
    n->ln_prev->ln_next = n->ln_next;
    n->ln_next->ln_prev = n->ln_prev;
    n->ln_next = NULL;
    n->ln_prev = NULL;
}

static inline void *
tp__list_pop_first(tp_list *l)
{
    void *item = tp__list_first(l);
    if (item != NULL) {
        tp__list_remove(l, item);
    }
    return item;
}

#endif
