// A small Markdown renderer that builds DOM nodes: every piece of text from the model
// becomes a text node (never HTML), so whatever the model writes shows as text. Fenced
// code (also unclosed, while it streams), headings, lists, quotes, rules, tables,
// paragraphs; inline code, bold, italics, strikethrough and http(s) links.

/** An element with attributes and children (strings become text nodes). */
export function h(tag, attrs, ...kids) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'class') el.className = v;
    else if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (k === 'value') el.value = v;
    else if (k === 'style') el.style.cssText = v; // CSSOM: allowed by the page's CSP, an attribute is not
    else el.setAttribute(k, v === true ? '' : v);
  }
  append(el, kids);
  return el;
}

function append(el, kids) {
  for (const k of kids.flat(Infinity)) {
    if (k === null || k === undefined || k === false) continue;
    el.append(k instanceof Node ? k : document.createTextNode(String(k)));
  }
}

// ---- code highlighting: one tokenizer for the C-like, shell and Python families ----

const KEYWORDS = new Set(('if else elif for while do return break continue switch case default function fn def ' +
  'class struct enum union const let var static import from export as in of new delete try catch finally throw ' +
  'raise with yield await async lambda pass None True False null true false nil self this typedef sizeof ' +
  'int char float double void long short unsigned signed bool auto pub mut impl use mod match loop where ' +
  'package func go defer type interface map range select chan echo then fi esac local').split(' '));

const TOKEN = /(\/\/[^\n]*|#[^\n]*|\/\*[\s\S]*?(?:\*\/|$)|--[^\n]*)|("(?:[^"\\\n]|\\.)*"?|'(?:[^'\\\n]|\\.)*'?|`[^`]*`?)|(\b\d[\w.]*\b)|([A-Za-z_][\w]*)/g;

/** Spans for code text: comments, strings, numbers, keywords (classes t-c, t-s, t-n, t-k). */
export function highlight(code, lang) {
  const out = [];
  const hashComments = !/^(c|cpp|c\+\+|js|javascript|ts|typescript|json|go|rust|java)$/i.test(lang || '');
  let last = 0;
  for (const m of code.matchAll(TOKEN)) {
    let cls = null;
    if (m[1]) cls = m[1][0] === '#' && !hashComments ? null : m[1].startsWith('--') && !/^(sql|lua|haskell)$/i.test(lang || '') ? null : 't-c';
    else if (m[2]) cls = 't-s';
    else if (m[3]) cls = 't-n';
    else if (m[4] && KEYWORDS.has(m[4])) cls = 't-k';
    if (!cls) continue;
    if (m.index > last) out.push(code.slice(last, m.index));
    out.push(h('span', { class: cls }, m[0]));
    last = m.index + m[0].length;
  }
  if (last < code.length) out.push(code.slice(last));
  return out;
}

// ---- inline ----

const INLINE = /(`+)([\s\S]*?[^`])\1(?!`)|\*\*([^*]+)\*\*|__([^_]+)__|\*([^*\s][^*]*)\*|(?<![\w])_([^_\s][^_]*)_(?![\w])|~~([^~]+)~~|\[([^\]]+)\]\(([^)\s]+)\)|(https?:\/\/[^\s<>()]+[^\s<>().,;:!?'"])/g;

function link(href, text) {
  if (!/^https?:\/\//i.test(href)) return text;
  return h('a', { href, target: '_blank', rel: 'noopener noreferrer' }, text);
}

/** Inline Markdown of text as nodes. */
export function inline(text) {
  const out = [];
  let last = 0;
  for (const m of text.matchAll(INLINE)) {
    if (m.index > last) out.push(text.slice(last, m.index));
    if (m[1]) out.push(h('code', null, m[2].replace(/^ (.*) $/, '$1')));
    else if (m[3] || m[4]) out.push(h('strong', null, inline(m[3] || m[4])));
    else if (m[5] || m[6]) out.push(h('em', null, inline(m[5] || m[6])));
    else if (m[7]) out.push(h('del', null, inline(m[7])));
    else if (m[8]) out.push(link(m[9], inline(m[8])));
    else if (m[10]) out.push(link(m[10], m[10]));
    last = m.index + m[0].length;
  }
  if (last < text.length) out.push(text.slice(last));
  return out;
}

// ---- blocks ----

const isTableSep = (l) => /^\s*\|?\s*:?-{2,}:?\s*(\|\s*:?-{2,}:?\s*)*\|?\s*$/.test(l);
const cells = (l) => l.trim().replace(/^\||\|$/g, '').split('|').map((c) => c.trim());

/** A fragment holding text rendered as Markdown. */
export function markdown(text) {
  const frag = document.createDocumentFragment();
  const lines = text.replace(/\r\n?/g, '\n').split('\n');
  let para = [];
  const flush = () => {
    if (para.length) frag.append(h('p', null, inline(para.join('\n'))));
    para = [];
  };
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    let m;
    if ((m = /^\s*(```+|~~~+)\s*([\w+#.-]*)/.exec(line))) {
      flush();
      const fence = m[1], lang = m[2], body = [];
      for (i++; i < lines.length && !lines[i].trim().startsWith(fence); i++) body.push(lines[i]);
      const code = body.join('\n');
      frag.append(h('div', { class: 'code' },
        h('div', { class: 'code-bar' }, h('span', null, lang || 'text'),
          h('button', { class: 'link', type: 'button', title: 'Copy the code',
            onclick: () => navigator.clipboard?.writeText(code) }, 'copy')),
        h('pre', null, h('code', null, highlight(code, lang)))));
    } else if ((m = /^(#{1,6})\s+(.*)$/.exec(line))) {
      flush();
      frag.append(h(`h${Math.min(6, m[1].length + 2)}`, null, inline(m[2])));
    } else if (/^\s*([-*_])(\s*\1){2,}\s*$/.test(line)) {
      flush();
      frag.append(h('hr'));
    } else if (/^\s*>/.test(line)) {
      flush();
      const q = [];
      for (; i < lines.length && /^\s*>/.test(lines[i]); i++) q.push(lines[i].replace(/^\s*> ?/, ''));
      i--;
      frag.append(h('blockquote', null, markdown(q.join('\n'))));
    } else if ((m = /^\s*([-*+]|\d+[.)])\s+/.exec(line))) {
      flush();
      const ordered = /\d/.test(m[1]);
      const list = h(ordered ? 'ol' : 'ul');
      for (; i < lines.length; i++) {
        const it = /^\s*([-*+]|\d+[.)])\s+(.*)$/.exec(lines[i]);
        if (it && /\d/.test(it[1]) === ordered) list.append(h('li', null, inline(it[2])));
        else if (lines[i].trim() && /^\s{2,}/.test(lines[i]) && list.lastChild)
          list.lastChild.append(' ', ...inline(lines[i].trim()));
        else break;
      }
      i--;
      frag.append(list);
    } else if (line.includes('|') && i + 1 < lines.length && isTableSep(lines[i + 1])) {
      flush();
      const head = cells(line);
      const rows = [];
      for (i += 2; i < lines.length && lines[i].includes('|'); i++) rows.push(cells(lines[i]));
      i--;
      frag.append(h('table', { class: 'md' }, h('thead', null, h('tr', null, head.map((c) => h('th', null, inline(c))))),
        h('tbody', null, rows.map((r) => h('tr', null, r.map((c) => h('td', null, inline(c))))))));
    } else if (!line.trim()) {
      flush();
    } else {
      para.push(line);
    }
  }
  flush();
  return frag;
}
