"""Online tree-budget control: pick each verify step's budget N to maximise tokens per second.

Contract
--------
Pure logic: no torch, no model call, no clock (every time comes in through a :class:`StepRecord`),
no randomness: the same records give the same budgets. The decoding loop
(:func:`talon_sd.decoding.decode`) calls, every verify step::

    next_budget(catch_up_tokens, tokens_left)
                                     N for the coming step, 1 <= N <= max_budget (root counted; N = 1 is a
                                     plain decoding step: no draft forward, the target verifies the root);
                                     the drafter's pending catch-up and the tokens still allowed (design 6)
    keep_growing(tree_log_p, frontier, widths_so_far, budget)
                                     asked by the builder before each draft forward but the first
    observe(StepRecord)              what the step built, accepted and cost

and reads ``reason`` after ``next_budget`` (why N: a key of :data:`REASONS`) into the step's stats.

The controller decides how many tokens are drafted, never which tokens are emitted: losslessness does
not depend on it. Quantities follow :mod:`talon_sd.verify`: a step that accepts ``a`` draft tokens
commits ``a + 1`` (the bonus token included); the rate of a budget is committed tokens per second.

The prefix property (what makes one step informative about every smaller budget)
------------------------------------------------------------------------------------
The loop reports the tree's nodes in the builder's *inclusion order* (root first): the tree built
with budget k is exactly the first k nodes of the tree built with any budget M >= k (TALON,
Algorithm 2 of arXiv 2601.07353: whole layers, the last one cut to the best N - |T| by score; chain;
EAGLE after its global rerank). Greedy acceptance of a prefix tree is the big tree's accepted path
cut at the first node of position >= k (positions increase along a path). So one verified step of
size M gives, for every k <= M, the accepted length and the draft forwards budget k would have run
(:func:`prefix_outcome`); a step that stopped short of its budget (``complete``) gives the same for
every k > M. Under sampling this is an approximation; it only steers the budget.

Layout
------
This package's modules, one job each (the engine imports the package, never a module of it)::

    records.py     StepRecord: what a verified step reports; prefix_outcome: the prefix property
    costs.py       CostCurve, CostPrior: measured seconds by size (design 1, with 21, 33, 42, 53)
    acceptance.py  Calibration, Predictability: acceptance by path probability and by the text (designs 4, 12)
    settings.py    ControllerSettings and the defaults its designs name
    controller.py  BudgetController: the choice of each step's budget (designs 2-51, 53)
    _checks.py     argument checks and a median

Design ("Improvement" marks where this goes past the obvious recipe)
------
1. Costs (:class:`CostCurve`): verify seconds by tree size, draft seconds by forward width, and the
   rest of a step (tree building, cache commit, bookkeeping) by the number of draft forwards (0 = a
   plain step: this subsumes the plain / drafted split and charges per-layer Python work to the
   layers). Each keeps the last ``cost_samples`` samples per size; the curve is the median per size,
   made non-decreasing by weighted isotonic regression (pool-adjacent-violators, weights = sample
   counts) and interpolated linearly. Improvement: isotonic regression rather than a running max, so
   one slow outlier at a small size does not lift every larger size. Outside the known sizes the curve
   goes on with the larger of the last segment's and the whole curve's slope (never negative; floored
   at 0 below), so a tree size never measured is neither free nor as dear as the largest one. A
   :class:`CostPrior` seeds the points; once sizes are measured, unmeasured prior points are scaled by
   the median measured/prior ratio (a longer context or a busier machine moves the whole curve).
   Improvement: the first draft forward of a step that follows a plain step also forwards the tokens
   the plain steps committed (the drafter's catch-up, :class:`talon_sd.drafters.ModelDrafter`); that
   sample is left out of the width table, so a run of plain steps does not make drafting look dear.
2. Acceptance, counterfactually: each drafted step becomes a sample holding, for every candidate
   budget it informs, (committed tokens, tree size, draft forwards). Each candidate keeps its last
   ``window`` informing samples, weighted ``0.5 ** (age / half_life)``; a sample's seconds are
   recomputed from the current curves (overhead(forwards) + draft(widths it needs) + verify(size)),
   and a candidate's rate is a ratio of sums, ``sum w tokens / sum w seconds``, trusted from
   ``min_steps`` samples on. Plain steps inform nothing about acceptance; rate(1) = 1 / (overhead(0)
   + verify(1)) comes from the costs alone. Improvement (chained paired estimates): candidates above
   the current choice are informed only by probes, which are few and may be old, and a candidate
   just chosen would otherwise be judged on those stale probes. Every step that informs k informs
   every smaller budget, so the smallest trusted drafted candidate takes its own rate and each larger
   one k the rate of the previous trusted candidate j times ``R_k(S_k) / R_j(S_k)``, how k did
   against j on the steps that inform k. Where all candidates share their samples (at or below the
   choice) this telescopes to the plain ratio of sums; above it, what the steps had in common (an
   easy stretch of code, a change of text) cancels, so a lucky or stale probe does not decide alone.
3. Choice and exploration: the choice is the trusted candidate of highest rate (a tie keeps the
   current choice, then goes to the smaller budget); an untrusted first choice (``initial_budget``)
   is kept until trusted unless even its optimistic rate loses to a trusted one. Step 1 is plain when
   verify(1) has fewer than ``min_steps`` measured samples (step 0 runs ``initial_budget``), and a plain
   step re-measures it every ``plain_refresh_interval`` steps (design 13). A *trial* runs the probe budget for ``probe_steps`` steps (more
   while it has fewer than ``min_steps`` samples); a probe of size P informs every candidate <= P at
   once. The probe is the smallest candidate >= ``probe_factor`` x the choice and >= ``initial_budget``
   (from plain, ``plain_probe_budget``): from a choice that fell to N = 2-3 after a poor stretch,
   twice the choice is too small to show what the budgets it left would do (alpaca, section 5). Trials start ``min_probe_interval`` steps apart; the interval doubles each
   time a trial does not move the choice up, up to ``max_probe_interval``, and resets when one does.
   Improvements: (a) from plain decoding, each lost trial aims twice as far as the last
   (``probe_levels`` levels, then over), because the rate need not be unimodal in N there: on the
   measured float32 CPU curve with code-like acceptance (tests/test_control.py) budgets 2-5 lose to
   plain decoding while 8 wins (one draft forward more for about the same verify cost); from a drafted
   choice the probe stays at the next rungs (design 10; with ``lean_margin`` > 0, the lean rung: design 17); (b) dominance: a probe is
   skipped (and counted as lost) when even its optimistic rate, ``max over F < k of (F + 1) /
   (overhead(F) + F draft(1) + verify(k))`` (each draft forward adds at most one layer, so F forwards
   accept at most F drafts), is below ``(1 - dominance_margin)`` x the current rate: where verifying
   T tokens costs T one-token steps the controller settles on N = 1 at step 2 and never probes again,
   while where costs leave room it keeps probing from plain, however bad the acceptance has been.
4. Early stop inside a step (:meth:`BudgetController.keep_growing`): a :class:`Calibration` over bins
   of cumulative draft log p (``calibration_edges``) learns a(p) = P(node accepted) and e(p) =
   P(one of its children accepted | it was expanded), as Beta posteriors (prior a = e^p at the bin's
   middle, e = 0.7 a; ``calibration_prior_strength`` pseudo-nodes) decayed by ``calibration_decay``
   per drafted step. Improvement: "expanded" means fed to a draft forward when the record shows it
   (layered records: forward j expands the layer forward j - 1 added), not merely "has children",
   since a TALON frontier node whose children all fail the gate was expanded for nothing; and the
   parents of a layer the budget cut are left out, as they lost children to the budget, not to the
   draft. With A = sum of a over the tree's non-root nodes (the best budget - 1 of them), g = sum of e
   over the frontier, T_now = overhead(F) + draft(widths so far) + verify(min(size, budget)), and
   T_next adding one forward of the frontier's width and verify(min(budget, size + b |frontier|))
   (b = nodes added per expanded node in the records' later layers), growth goes on iff
   (A + g + 1) / T_next > (A + 1) / T_now. With no drafted step seen yet it always says grow. In the
   synthetic worlds of tests/test_control.py this recovers most of what too large a budget loses
   (a fixed N = 64 on the bf16 CPU curve: 0.67 -> 0.99 of the best fixed N) and costs at most ~1%
   near the optimum; a margin in either direction did worse. **Off by default**
   (``early_stop=False``): on the real Qwen pair in bf16 (docs/BENCHMARKS.md section 5) the one-layer
   look-ahead stopped chat trees after the root's children in almost every step (a deeper tree pays
   only over several layers), such steps count as ``complete`` for every larger budget, every budget
   then looked alike and the choice collapsed to N = 2-4 (MAT 2.0 where N = 16 accepts 4.5).
5. Cost: on this project's 2-core CPU (Python 3.11, the machine busy with other work, load ~4) with
   the defaults (window 32, 16 candidates), next_budget + observe took 0.17-0.33 ms per step together
   (mean trees of 5 to 60 nodes; 0.33 ms with 64-node trees every step) and keep_growing 4-14 us per
   call. Per step the work is O(window x candidates), plus O(known sizes) to refit the cost curves.

6. The drafter's catch-up. A draft LM forwards nothing on plain steps and its prompt only at the first
   drafted step (lazy prefill): the first drafted step of a request forwards the whole prompt (700
   tokens on CNN/DM), later ones the plain steps' tokens. The loop passes ``catch_up_tokens``
   (:attr:`talon_sd.drafters.Drafter.catch_up_tokens`) and ``tokens_left``; the first forward of such a
   step, less draft(width), is a sample of a catch-up curve by tokens (bucketed to powers of two,
   scaled to the bucket). A drafted choice k then runs only if drafting the expected rest E of the
   sequence saves more than the catch-up costs, ``E (1 / rate(1) - 1 / rate(k)) > catch_up(P)``,
   else the step is plain (the catch-up keeps waiting; ``catch_up_skips`` in the summary); a trial
   starts only if its catch-up is at most ``trial_cost_share`` of E's plain seconds (design 11
   adds what the probe's last trials lost). E is
   ``tokens_left`` capped by the median length of the last finished sequences (a QA answer of 20
   tokens does not earn back a prefill over max_new_tokens = 128; one cut by its token limit counts
   as endless). Before a catch-up was measured it
   costs nothing (as before). Measured in tests/test_control.py: float32 costs, code-like acceptance,
   a 700-token prompt and 12-step answers: 0.68 of plain when not told, level with plain when told;
   where drafting pays (bf16 costs) the prefill is paid. On the real pair (hostile float32 reading of
   docs/BENCHMARKS.md section 5) qa went from 0.68x to 1.00x of ar; a long prompt whose carried rates
   promise more than its prefill still pays it (sum, 0.77x: the carried choice, not the prefill,
   is most of that loss).
7. Carried samples at a new sequence (:meth:`BudgetController.for_next_sequence`) are scaled by one
   factor so that no candidate's total weight exceeds ``carried_weight`` (8) steps: rates (ratios of
   sums) are unchanged at the start, and after a few steps of its own the new request's acceptance
   decides. The motivating runs: qa after sum (bf16 sweep, 0.72 of the best fixed N) and sum/qa after
   humaneval (hostile float32, 0.92x/0.68x of ar), where 32 carried samples outweighed a short
   request's 2-12 steps. In the synthetic code -> chat switch (6-step requests, 3 seeds) 8 gave 0.93
   of the best fixed N against 0.91 uncapped; 4 or less lost on the hostile carried test (0.95 of
   plain against 0.97). On the real pair (bf16 sweep, docs/BENCHMARKS.md section 5) it moved gsm8k
   from 0.91 to 0.95 of the best fixed N but not qa (0.72 -> 0.76): 2-7-step requests are still
   decided by 8 carried steps' worth, and carried trials land inside them.

8. Change points and bounded exploration. (a) A new sequence's first ``release_steps`` drafted steps are
   compared with the carried samples at the largest budget they all inform; when their mean committed
   tokens differ by more than ``release_ratio`` (1.5) and by more than ``RELEASE_Z`` standard errors (or, design
   47, all of them accepted nothing and a run that long is unlikely among the carried steps), the
   text has changed (code -> news summary) and the carried samples are scaled down to one step's weight
   in all: the sequence's own steps decide from then on, while budgets it has not tried keep what the
   carried probes said of them. The motivating run: hostile float32, sum after humaneval (0.77x of ar):
   carried samples committing ~25 tokens a step at N = 32 against sum's ~7 kept 20-64-node trees for the
   whole first sum request even capped at 8 steps' worth. In tests/test_control.py's code -> poor-text
   switch the budget falls within the 12-step request (seen after 2-6 drafted steps); on unchanged text it
   does not fire. The z-test matters: a ratio test alone fired on a 3-step poor stretch of code. (b) A trial
   starts only while the seconds trials lost against the rate of the choice they left (signed: a won
   trial gives its loss back) are at most ``exploration_share`` (5%) of the observed seconds, both weighted
   by age with ``exploration_half_life`` (64 steps): the regret of exploration is bounded locally. Counted
   over the whole run (half-life inf) the bound never bound on the real pair: by the qa requests of the
   hostile float32 reading (docs/BENCHMARKS.md section 5, fourth reading) ~700 s had been observed, and
   three 2-step trials cost 0.83x of ar there. In the synthetic short-request worlds the local bound is
   -2% to +4% against no bound (24-token requests, float32/bf16 x code/chat).
9. Tokens left, conditioned on the sequence so far: E is the median of what the last ``LENGTHS_KEPT`` (3)
   finished sequences that outlasted this one's tokens so far went on to commit (15 tokens into a run of
   20-token answers, 5 are left), capped by ``tokens_left``; three, not sixteen, so that a run of short
   answers after long ones is seen by the third.

10. (With ``lean_margin`` > 0, design 17 replaces this: the probe is the lean rung.) Probes from a drafted choice stay near it: the probe is always the smallest candidate >= max(``probe_factor``
   x choice, ``initial_budget``); only from plain decoding do lost trials aim further (design 3a). Between
   two drafted budgets the rate is about unimodal in N (a node more costs a little more verify, a layer
   more one draft forward), and a probe of 8 from N = 3 informs every rung 4-8 at about the cost of one
   more draft forward. The motivating run (bf16 sweep, docs/BENCHMARKS.md section 5, sweep 8): sum and
   mt_bench requests sat at N = 2-3 for 30-60 steps (auto 0.87 and 0.96 of the best fixed N) while their
   trials, twice as far after each loss, went to 32-64 nodes, lost, doubled the interval and used up the
   exploration bound. In tests/test_control.py's poor -> better text switch (bf16 costs) the request
   reaches a median 0.98 of its best fixed N (0.95 before); levels from plain stay (the float32 code
   world left plain decoding for N = 8 at 0.95-0.98 of the best with them, 0.93-0.97 without). On the real
   pair (sweep 9): sum 0.87 -> 0.99 and qa 0.91 -> 0.99 of the best fixed N, steps at N = 2-3 on sum 148 of
   183 -> 0 of 72. Not handled: a drafted choice that only plain steps ran (catch-up skips through whole
   long-prompt requests) still seeds a trial at twice its size; at float32 and T = 1 that opened a QA
   request with 40 nodes (section 5, sixth hostile reading): design 11.

11. What a trial may cost a request. (a) A trial starts only if its catch-up plus what the last trials of
   the same probe budget lost against the choice's rate (their catch-up left out; a running mean that
   halves the old value at each new trial; a won trial counts its gain as nothing) is at most
   ``trial_cost_share`` (5%) of the plain seconds of the tokens the sequence is expected to have left
   (design 9's E; the bound was 10% and on the catch-up alone before); otherwise it is postponed to the
   next step (``probes["postponed"]`` counts such steps; the schedule is unchanged). Design
   6 bounded only the catch-up, and design 8's exploration bound is local in steps, not in requests: in
   float32 at temperature 1 (docs/BENCHMARKS.md section 5, sixth hostile reading) every trial from plain
   decoding lost, and one 2-step trial of 16 nodes on a 16-token QA answer cost a fifth of it, while the
   same trial on a 64-token answer costs 5%. A probe never tried is not bounded beyond its catch-up, so
   a change of text or machine is still found. (b) A drafted choice that ran no drafted step in this
   sequence or the previous one (all its steps catch-up skips, design 6) runs itself before a trial
   probes above it: a trial is judged against the choice's rate, and that rate was learned on other text.
   In the synthetic bench-like float32 sequence (runs of 2 requests per dataset, 8 seeds, chat / medium /
   code acceptance at temperature 1; 16-token QA answers) the mean per-dataset ratio to plain went from
   0.88-1.00 to 0.94-1.00 (qa 0.88 -> 1.00, gsm8k 0.94 -> 0.99, humaneval 0.96 -> 1.00); mt_bench's first
   request, where a fresh controller learns its costs, stays the lowest (0.91 -> 0.94). The bf16
   scenarios of design 10 were unchanged or better (short chat requests 0.976 -> 0.983 of the best fixed N).

12. The target's confidence says what text it is (:class:`Predictability`). Every step, a plain one too,
   reports the target's top-1 probability before each token it commits (``StepRecord.confidence``, one
   softmax row per committed token, 0.3-1 ms a step on this CPU). On 40 training answers of the packaged
   Qwen pair (teacher-forced, bf16) the 0.5B draft's greedy token matched the 1.5B target's with
   probability 0.36 / 0.48 / 0.65 / 0.85 / 0.95 / 0.99 at target confidence < 0.3 / 0.3-0.5 / 0.5-0.7 /
   0.7-0.9 / 0.9-0.97 / >= 0.97, and per answer the mean confidence and the agreement correlate (r = 0.73):
   what plain steps see predicts what drafting would accept, for free. The controller learns, per bin of
   confidence, how often the tree held the token the target committed next (decayed Beta posteriors over
   every expanded accepted-path position; prior: the draft's top-1 misses at rate 1 - q and the tree
   catches half of that), and replays the last ``confidence_window`` (16) confidences as a chain: the
   tokens a step of F forwards would commit on text like that. A budget's predicted rate is that over the
   seconds its own informing samples cost (their forwards and tree sizes; from any text, as cost hardly
   depends on it), or, without samples, the optimistic chain bound of design 3b. From plain decoding,
   (a) a due trial runs the largest probe level (design 3a) whose predicted rate reaches (1 -
   ``dominance_margin``) of plain decoding's, and is postponed while none does (``probes["unpredictable"]``
   counts such steps; the schedule is not pushed back, so the trial runs when the text allows); (b) a
   probe level predicted to beat plain decoding by ``PREDICTED_WIN`` (10%) starts a trial before it is
   due, at most once every ``min_probe_interval`` steps after the last trial: a change to predictable
   text is tried when it shows, not when the doubled interval says. Both are still bounded by designs 8
   and 11. Improvement over designs 8-11, which bound what trials may lose but place them blindly: those
   runs' trials from plain decoding fell on chat (hostile float32 readings 4-7, all lost) while the code
   requests where drafting wins in float32 (readings 3-4, 1.1-1.2x) got none. In tests/test_control.py's
   float32 chat -> code sequence (N = 8 is 1.13x plain on the code) the chat requests went from 0.966 to
   0.982 of plain and the code requests from 1.003 to 1.029. In a bench-like float32 sequence of six
   dataset-like worlds (2 requests each, 8 seeds, greedy- and T = 1-like acceptance) the chat-like ones
   rose from 0.94-0.98 to 0.97-1.00 of plain, while a code world where no fixed N beats plain fell from
   1.00 to 0.98-0.99 and 16-token QA answers from 1.00 to 0.99 (trials now run there, and lose); bf16
   scenarios were level or better (a request after 40 poor steps: worst 0.68 -> 0.92 of the best fixed N).

13. Plain decoding's rate is measured, not sampled once: a plain step is due while verify(1) has fewer than
   ``min_steps`` measured samples (unless a prior gives it), and ``plain_refresh_interval`` is 64 steps
   (was 256). Every drafted rate is judged against rate(1), so one stalled measurement of it (a plain step
   2.5x slower than usual) made every drafted budget look faster than plain decoding until the next refresh.
   The float32 reading 8 (docs/BENCHMARKS.md section 5) drafted every step of 18 of 21 requests, 0.91x of
   plain overall, and ran no plain step in them; two instrumented replays of its first requests measured
   verify(1) in their first plain steps and went plain within 8 steps, as the reading before did (0.99x):
   one early, slow sample is the likely cause (the runs keep no per-step seconds to show it). In
   tests/test_control.py's float32 chat world with such a stall: 0.69-0.76 of plain before, plain decoding
   again within 16 steps since. Cost: two more plain steps once per generator, and one plain step in 64
   (on a machine where drafting wins 1.5x, ~0.5%).

14. A new request's catch-up is not paid on the last requests' rate alone. At a new sequence the draft LM must
   first forward the whole prompt; design 6 pays that when expected tokens x (1 / rate(1) - 1 / rate(N)) exceeds
   it, with rate(N) learned on the requests before. When that rate pays the catch-up back less than
   ``CATCH_UP_MARGIN`` (2) times over, the request first runs plain steps until ``OWN_CONFIDENCES`` (4) of its own
   target confidences are in, and then pays only if the smaller of the carried rate and the rate those predict
   (design 12) pays it back. Also: the catch-up curve extrapolates past its largest measured bucket at least
   linearly in tokens (a flat curve charged a 709-token prompt as the 128-256 tokens measured before), and a
   trial cut by the end of its sequence is judged there instead of running its last step as the next
   request's first (which paid that request's catch-up for a probe). In the float32 reading 9 the first sum
   request (709-token prompt) inherited humaneval's choice of 24 nodes and lost (0.74x of ar); in
   tests/test_control.py's float32 code -> long-prompt chat sequence: 0.80-0.83 of plain in 3 of 6 seeds
   before, 1.00 in all since. Cost: in bf16, code requests with a 700-token prompt and a 36-token answer
   went from 1.20x to 1.12x of plain (4 plain steps first); requests whose catch-up pays back twice over
   (every bf16 case of 64+ tokens in the synthetic worlds) are unchanged.

15. A trial may pay more catch-up when the request's own text predicts a win that pays it back. Design 11's share
   (``trial_cost_share``, 5% of the expected rest's plain seconds) is flat: in float32 the draft LM's catch-up over
   a 200-token prompt plus the plain steps since costs more than that on a 64-token answer, and in the float32
   reading 11 (docs/BENCHMARKS.md section 5) 884 of 1,113 steps were ``trial-catch-up``, all of humaneval's but
   7. From plain decoding, a trial over the share still starts when the best probe rung's rate predicted from the
   sequence's own last ``confidence_window`` (16) target confidences (design 12; none before 16 are in) saves,
   over the expected rest, at least ``CATCH_UP_MARGIN`` (2) times the catch-up plus the probe's past losses.
   In ``scripts/controller_scenarios.py`` (16 seeds): float32 code, where 1 seed stayed plain (1.000 against a
   median 1.133), min 1.070 (mean 1.133 -> 1.138); float32 code requests with 200-token prompts after chat
   (8-ms-a-token catch-up), never a trial before: mean 1.000 -> 1.004 (0.970-1.075 by seed); short-prompt code
   after chat min 0.992 -> 0.981 (mean 1.040 -> 1.039); the other nine scenarios unchanged. At 128 tokens the
   share alone affords those trials (unchanged). A small gain: at 64 tokens a 200-token catch-up is ~8% of the
   request's plain seconds and a win of 1.15x saves ~13%, which rarely clears a margin of 2. On the real pair
   (float32 reading 12) humaneval still ran plain: its own confidences predicted no win worth twice the catch-up.

17. Lean one rung up (:meth:`BudgetController._lean`). A drafted choice c runs, instead of itself, the next candidate
   above it that is at least min(``initial_budget``, :data:`LEAN_FLOOR` = 8) (from 5, 8: the rung 6 adds a draft
   forward for one node and would stop a climb), while that rung's trusted rate is within ``lean_margin`` (3%; 1%
   since design 22) of c's, or, untrusted, while its optimistic rate is not dominated (design 3b) and trials have
   not lost their exploration
   share (design 8; an untrusted rung's steps count their loss against c's rate there, as a trial's do); only once c
   ran a drafted step in this sequence or the last (design 11b), and only when both c and a trusted rung pass the
   catch-up test of designs 6 and 14 (an untrusted rung is judged as c). A lean step pushes the trial schedule back
   by the interval: the lean is the probe. Every step at the rung informs c and
   every budget below, paired on the same steps, so the choice's neighbours are measured all the time instead of by
   2-step trials spaced 4-64 steps apart; when the rung wins it becomes the choice and the next rung is leaned to (a
   climb); when it is clearly worse, c runs itself and the scheduled trials probe that rung, not 2 x c (design 10).
   Where verification is flat (bf16 on the Intel Xeon, docs/BENCHMARKS.md section 5, sweep 12) the rate is flat to
   2-3% around the best N while the estimates are noisier than that: a choice left on a lost 2-step trial of 16 sat
   at N = 8 for 20 steps of chat, and trials of 2 x c (32-64 nodes on code, about one draft forward per accepted
   token) were 90 of 645 steps. Measured in ``scripts/controller_scenarios.py``'s real-pair-like Intel bf16 worlds
   (easy and hard stretches fitted to sweep 12's per-step acceptance at N = 8 / 16 / 24; 8 seeds, 5 code then 5 chat
   requests of 128 tokens, auto over the best fixed N of the block, min / median / mean): code 0.880 / 0.970 / 0.954
   -> 0.939 / 0.966 / 0.963, chat 0.886 / 0.917 / 0.922 -> 0.920 / 0.971 / 0.977; with the product's initial budget
   of 16 (16 seeds, median) code 0.942 -> 0.957 and chat 0.961 -> 0.977. A fixed N = 12, the best single N in those
   worlds, reads a median 0.989 (code) and 1.000 (chat) of the best fixed N by the same measure, N = 16 1.000 and
   0.975: the rest is what learning costs against a choice made knowing the text. Leaning one rung without the floor
   of 8, chat fell to N = 4-5 for 100+ steps (0.944); probing 2 x c beside the lean, code lost 3-9% of a block to
   3-step trials of 40-48 nodes (0.944). The float32 and EPYC bf16 scenarios moved by -0.7% to +1.4% in median
   (float32 code 1.133 -> 1.126, float32 chat -> code: code 1.034 -> 1.048). Tried and not adopted in the same
   worlds: a longer memory (half-life and window 64: code 0.967, chat 0.956-0.964), a hysteresis of 1-4% on every
   change of choice, a margin of 2%, 5% or 8%, 3-step trials: all within the seeds' noise of about 1-2%.

18. Below the initial budget, lean twice as far (:meth:`BudgetController._lean_rung`). A drafted choice c below
   ``initial_budget`` leans to the first candidate >= min(``initial_budget``, max(:data:`LEAN_FLOOR`, ``lean_reach`` x c))
   (``lean_reach`` 2: from 8 to 16, from 10 or 12 to 16, from 4 to 8) instead of the next rung; at and above the initial
   budget the lean is design 17's. Steps inform only the budgets at or below their own (the prefix property), so a
   choice that fell on a noisy stretch no longer measures the budgets it left: on the real pair's recorded trees
   (``scripts/replay_positions.py``, exact acceptance at every position of sweep 13's answers) the first mt_bench
   answer of a fresh controller fell 16 -> 8 -> 4 within 11 steps, on chained estimates of 12 and 16 from their
   first 3 samples, and ran 50 steps at N = 4 (6.12 tok/s against 6.90 for a fixed N = 16); the next rung above 8
   (10) says nothing of 16, and 16's rate, once trusted on 3 samples, was never measured again. The estimates
   themselves are nearly unbiased there: a fixed N = 32 run's steps predict every smaller budget's rate within
   2-4% of that budget's own run on mt_bench, so the loss is sampling noise and the one-way flow of information,
   not a biased estimator. Measured in that replay (35 prompt turns, 32 timing-noise seeds, auto over the best of
   the sweep's fixed N = 8 / 16 / 24 per dataset, mean): mt_bench 0.972 -> 0.983, qa 0.969 -> 0.980, humaneval
   0.995 -> 0.997, alpaca 0.990 -> 0.985, gsm8k 0.981 -> 0.978, sum 0.975 -> 0.969, all 0.983 -> 0.986: a gain where
   the choice falls below 16 (chat), level within the seeds' noise (~0.5%) elsewhere. ``scripts/controller_scenarios.py``
   is unchanged at the default ``initial_budget`` of 8 and level with 16 (real-pair-like code 0.958 -> 0.957, chat
   0.956 -> 0.957, median of 8 seeds). Tried in the same replay and within that noise: a lean margin of 5%, a carried
   weight of 4, min_steps 4, a half-life of 48; not adopted: leaning to twice the choice above the initial budget too
   (code would lean to 48-64 nodes: -1.7% on code in the synthetic worlds), the largest budget a one-standard-error
   bound on the paired ratio does not rule out (mt_bench +1.5%, qa -7%: chat's per-step variance keeps 32-node trees
   in reach), and moving the choice down only on such evidence (chat ratchets up to 32 and carries it into qa).

19. The initial budget is an anchor left only on evidence (:meth:`BudgetController._admitted`). A drafted candidate
   other than ``initial_budget`` (the product's default, 16, or a tuned profile's N) may be chosen only while, below
   the anchor, its rate beats the anchor's by more than :data:`ANCHOR_GAP` (10%), or its paired rate, on the steps
   that inform both, beats the anchor's by more than ``anchor_z`` (1) standard errors
   (:meth:`BudgetController._paired_z`, the delta method on the two ratios of sums); plain decoding is always admitted (its rate comes from the costs), and while the
   anchor is untrusted every candidate is. Where the rate is flat around the anchor (bf16 on the Intel Xeon: every
   fixed N from 12 to 32 within 3% of the best per dataset) the estimates move the choice on noise: a 3-sample
   stretch took mt_bench from 16 to 8, a lucky one took sum to 32 for a request, and each such move costs 3-5% of a
   request. An anchor cannot do worse than the anchor's own rate by more than about one standard error of the
   difference while it holds, and where the anchor is wrong by a wide margin (float32: 16 nodes verify at 2-3x one
   token) the gap admits the smaller budgets at once: every step at the anchor measures them, paired. Above the anchor
   only the paired test admits: those rates come from a few lean and trial steps, chained, and in a first sweep
   with the gap on both sides mt_bench's predictable second turns took 40-48-node trees on it and carried them into
   the next request (19.9 s against 17.2 s at N = 16). The test counts weights as steps (carried samples capped at
   ``carried_weight``, aged ones: less evidence); with squared weights the cap cancelled, and in sweep 15
   (docs/BENCHMARKS.md section 5) humaneval's 32-node choice passed the test all through sum's first request and qa.
   Measured on the recorded trees of sweep 13 (``scripts/replay_positions.py --seeds 32``, auto over the best of
   N = 8 / 16 / 24, mean / worst seed; design 18 -> 19): mt_bench 0.983 / 0.949 -> 0.988 / 0.975, alpaca 0.985 /
   0.881 -> 0.985 / 0.970, gsm8k 0.978 / 0.945 -> 0.997 / 0.981, humaneval 0.997 / 0.932 -> 0.995 / 0.984, sum 0.969 /
   0.932 -> 0.993 / 0.975, qa 0.980 / 0.931 -> 1.005 / 0.953, all 0.986 / 0.970 -> 0.995 / 0.991.
   ``scripts/controller_scenarios.py --set initial_budget=16`` (the product's anchor; median of 16 seeds): bf16 level
   (real-pair-like chat 0.957 -> 0.964 of the best fixed N), float32 code, where the anchor is the wrong budget, 1-2%
   lower and still above plain (1.107 -> 1.096 of plain; 200-token prompts 1.059 -> 1.026). Tried: anchor_z 2 or 3
   (float32 code 1.103 -> 1.080 of plain: a wrong anchor holds too long), no gap (Intel float32 code mean 1.183 ->
   1.158), a gap of 5% (replay level); keeping the current choice (not the initial budget) until a candidate beats it
   by z standard errors: qa 0.980 -> 0.941, the carried choice of the dataset before held.

20. The gap waits for the anchor's evidence (``anchor_gap_steps``, 8). Below the anchor, the 10% gap of design 19
   admits a candidate only once the anchor has 8 samples (steps at it or above it), or while the anchor is no faster
   than plain decoding (a wrong anchor: then the gap acts at once, and a choice of plain, which no longer measures
   the anchor, cannot hold it back). In sweeps 16 and 17 a fresh controller's first mt_bench answer read N = 8 as
   10-17% faster after 3-4 steps at 16 and ran it for most of the answer, 7% slower than N = 16 there (a step at 8
   no longer measures 16, so the estimate stays until a trial). Replay of sweep 13's trees: unchanged (its first
   answer's early steps do not show the effect); ``controller_scenarios.py --set initial_budget=16``: level within
   1% (float32 code, 200-token prompts 1.026 -> 1.035 of plain; float32 chat -> code, code 1.013 -> 1.001; Intel
   float32 code 1.193 -> 1.194). Tried first: the sample count alone (no plain clause): Intel float32 code fell
   from 1.19 to 1.00 of plain, since plain, once chosen, never measured the anchor again and the gap stayed shut.

21. Verify costs are re-measured where the choice is made (``cost_refresh_interval``, 16;
   :meth:`BudgetController._refresh_due`). A tree size measured only during a slow spell of the machine kept that
   cost for good once the controller moved away from it: on the 2-core Xeon, verify steps run in spells 20-40%
   slower for 5-10 steps (and single steps 2x), and in a traced mt_bench answer (docs/BENCHMARKS.md section 5) a
   fresh controller measured N = 16 in such a spell (297-326 ms against 240 ms later), then leaned to 20 and 24 and
   never verified 16 again; the curves are carried, so that held for every later answer. Now, at most once every
   16 steps, the candidate just below a drafted choice or the choice itself (whichever ran longer ago: the choice
   while the controller leans above it or after catch-up skips) runs one step once 16 or more steps ran after its
   last one (not charged to the exploration share, like plain-measure steps); and the verify curve fits each size
   from its samples of the last 32 steps (at least its newest :data:`RECENT_SAMPLES` = 3), so a spell's samples
   leave the fit after three refreshes. Synthetic worlds (tests/test_control.py, i.i.d. noise): flat verification 0.984 -> 0.987 of the best fixed N; on an acceptance
   drop the budget before the drop 10.9 -> 15.2 (it is 16 and more in that world). Replay of sweep 13's trees
   (i.i.d. noise, so a refresh only costs): all 0.995 -> 0.994, alpaca 0.985 -> 0.971 (mean of 32 seeds), within
   the seeds' spread elsewhere. Tried first: refreshing the rung below and the choice each every 16 steps (two
   steps in 16: flat verification 0.967), and leaving a size without recent samples out of the fit (a single fresh
   sample then set its cost; with only the running sizes fresh, the curve below them went flat: 16 cost as much as
   24, the lean bias again).

22. A lean margin of 1% (``lean_margin``, was 3%). In every real bf16 sweep on the Xeon (16, 17, and 18's first five
   mt_bench turns, design 21) auto leaned from 16 to 20 on most chat steps and lost 3-8% per answer to N = 16
   (sweep 18's first turn: 20 nodes accepted 3.54 tokens a step against 16's 3.31, +7%, for 0.46 more draft
   forwards of about 104 ms and 15 ms more verify, +11% a step: 20 is 3-4% slower, inside the 3% margin within
   the estimates' noise). With 1% the lean stops where the rung above is measurably slower, and still runs where it
   is level or faster (code climbs to 24-32 as before). ``python scripts/controller_scenarios.py --seeds 48 --set
   initial_budget=16`` with ``--set lean_margin=0.03`` for design 21: Intel bf16 real-pair-like code 0.952 -> 0.960
   of the best fixed N, chat 0.961 -> 0.972 (with slow spells 0.949 -> 0.961 and 0.961 -> 0.957), float32 code
   1.111 -> 1.115 of plain (200-token prompts 1.037 -> 1.056), the rest level. Replay of sweep 13's trees
   (``--seeds 32``): all 0.994 either way (mt_bench 0.988 -> 0.991, alpaca 0.976 -> 0.974, humaneval 0.995 ->
   0.992); a margin of 0 loses there (all 0.990, qa 0.988: the rung above is then rarely measured).

23. What a float32 run needs to leave plain decoding (a fresh look at the hostile reading, docs/BENCHMARKS.md section
   5). On the Xeon in float32 the bench's first step (16 nodes) was the run's only drafted step: every later step
   was plain and every trial was refused, on code too, where a fresh controller gains 1.49x. Three estimates were
   wrong, each from too little data, and plain decoding never gathers more: (a) the catch-up curve, measured once
   at a 64-token bucket, was flat below it, so the one token of a plain step was charged as a whole prompt (0.4-1.6
   s): now a catch-up below the smallest bucket measured costs in proportion to its tokens; (b) the first draft
   forward of that step carried the prompt, so it was left out of the width table and draft(1) was read off the
   width-4 forward (0.23 s against 0.11 s): now the drafter runs a prompt's catch-up as a forward of its own
   (:meth:`talon_sd.drafters.Drafter.catch_up`; a draft LM's prefill ran apart anyway, so it costs nothing) and the
   loop times it apart (``StepRecord.catch_up_seconds``), which also gives the catch-up curve exact samples; (c) the
   predicted rate of design 12 took each probe's tree shape from steps drafted on other text (chat: 2 forwards where
   code runs 8): now those steps are blended with a chain estimate, a chain of one-node forwards that holds the
   next token as often as the draft's top-1 child did at that confidence (:class:`Predictability`, ``top``), weighted
   as :data:`SHAPE_PRIOR_STEPS` (1) step, so old steps from other text count for little. In tests/test_control.py's
   float32 worlds: chat then code with 200-token prompts, 1.007 -> 1.031 of plain (6 of 8 seeds draft on code, 2
   before); design 12's chat/code test 0.982 / 1.029 -> 0.986 / 1.042 of plain. Tried first: the chain bound of
   the tree's own follow (not the top-1's), alone or as the larger of the two: code 1.08 but chat 0.957-0.964 of
   plain (it promised chat trees that never came).

24. No exploration near a sequence's end (``explore_min_tokens``, 32). Trials, lean steps and cost refreshes run only
   while the sequence is expected to commit at least 32 more tokens (design 9's estimate, capped by the tokens
   left): what they learn is used over the rest of the request, and a 3-10-step QA answer cannot repay a 2-step
   trial of a larger tree (qa, sweep 19: 0.89 of the best fixed N, trials and leans on a fifth of its steps). A
   due trial waits ("trial-short") and starts in the next long sequence. Replay of sweep 13's trees
   (``--seeds 32``, mean, 0 -> 32): qa 1.004 -> 1.015 of the best of N = 8 / 16 / 24, mt_bench 0.991 -> 0.995,
   humaneval 0.990 -> 0.996, alpaca 0.967 -> 0.963, all 0.993 -> 0.996; ``controller_scenarios.py --seeds 48 --set
   initial_budget=16``: medians level (real-pair-like chat 0.972 either way, code 0.960 -> 0.966), the worst chat
   seed lower (0.918 -> 0.857). 16 and 24 read alike.

25. A large catch-up waits for the new text's own confidences. Design 14 let a carried drafted choice pay the draft's
   catch-up over a new prompt at once when the last sequences' rate paid it back twice over; after code that rate is
   high, and the float32 reading at temperature 1 (docs/BENCHMARKS.md section 5) paid a 700-token prompt's catch-up
   (about 3.5 s) on sum, whose text drafts poorly: 0.93x of ar over 64 tokens. A catch-up above ``trial_cost_share``
   of the rest's plain seconds (what a trial may spend) now also waits for :data:`OWN_CONFIDENCES` of the sequence's
   own target confidences, whose predicted rate then bounds the carried one. In bf16 on the Xeon a prompt's catch-up
   stays under that share, so this does not act there. tests/test_control.py: code, then news with a 700-token
   prompt: the first 4 steps plain, then at least 0.97 of plain decoding.

26. A catch-up costs at most ``tokens`` more rows of a draft forward (:meth:`BudgetController._catch_up_seconds`). The
   catch-up curve is sampled only when a catch-up is paid, and its first sample is the draft's first forward of the
   process (cold); in the float32 bench after design 25 that one sample (from the 8-token warm-up) kept every trial
   of all requests blocked ("trial-catch-up" from the first step on). The width curve, measured every drafted step
   and extrapolated linearly past its widest forward, bounds it, draft(tokens + 1) - draft(1), for catch-ups up to
   4x the widest forward measured (further out the extrapolation is a guess: in tests/test_control.py's bf16 world
   it priced a 700-token prompt at 0.6-1.0 s against 1.4 s, and 12-token answers paid it).

27. A new command starts from plain decoding unless drafting clearly paid (:meth:`BudgetController.for_new_command`).
   The controller memory (:mod:`talon_sd.controller_memory`) hands one command's controllers to the next process,
   whose prompt is another: on the AVX2 EPYC in float32 a code answer ended on a 12-node choice that read about
   plain decoding's rate, and the next command, a chat question, ran 7 drafted steps of that choice (trials, a
   cost refresh, the choice, a lean) before its own steps brought it down: 0.87x of ``--tree ar``. When the carried
   best drafted rate beats plain decoding by less than :data:`NEW_COMMAND_MARGIN` (how much acceptance differs
   between prompts, code against chat, is more than that), the new command keeps what the machine costs (cost
   curves, catch-up curve, calibration, predictability, finished lengths, exploration bookkeeping) and drops the
   acceptance samples and the last text's target confidences: its choice is plain decoding, trials from plain
   (design 12's predictions from its own text) find what its text affords, and the probe interval starts over.
   Where drafting won clearly (bf16 on the Xeon: 1.3-1.8x) the carried choice is kept, as between the requests
   of one process. A trial predicted from the text waits for a full ``confidence_window`` of it (a new command's
   first token had predicted a win on chat). tests/test_control.py, this CPU's curves: chat after code 1.00x of
   plain decoding (carried: 0.97x); fresh processes (docs/BENCHMARKS.md section 5, bracketed): 0.99x of ``ar``.

28. A clear win to leave plain decoding, and a bet judged on the whole text (``leave_plain_margin``, 5%;
   ``bet_window``, 64; ``bet_margin``, 1.5). On the AVX2 EPYC in float32 a drafted step costs 2-5 plain steps, and
   trees there beat plain decoding by a few percent outside code: (a) from plain decoding, a drafted candidate
   becomes the choice only when its rate beats plain decoding's by more than 5% (a few percent is within the noise of
   a handful of steps, and each switch pays the steps that show it was not): sweep 13's replay on that CPU's costs (8
   seeds), qa 0.906 -> 0.933 of plain decoding, its worst seed 0.888 -> 0.920, the other datasets within 0.01, bf16
   on the Xeon unchanged (it never chooses plain decoding). (b) A catch-up judged on the sequence's own text (designs
   14, 25) read the rate predicted from the last ``confidence_window`` (16) confidences; on sum at temperature 1
   (``scripts/trace_steps.py auto:humaneval:0 auto:sum:0 --temperature 1``) that prediction rose from 1.0 to 2.1
   tok/s over 15 confident tokens 60 tokens in, the 6.6 s catch-up of a 764-token context was paid for a saving of
   7.6 s, and the 4 drafted steps that followed ran at 1.1 tok/s against plain decoding's 1.8. The rest of a sequence
   is now judged on up to 64 of its own tokens. (c) Such a bet (a catch-up above a trial's share) is paid only when
   the predicted saving is 1.5 times its cost (``bet_margin``): that bet was predicted to repay 1.16 times, and the
   catch-up estimate itself was 25% low in the trace's first run (6.1 s against 8.1 s). The replay is neutral (sum
   1.039 -> 1.044, the rest within 0.002; bf16 unchanged); a bf16 world of tests/test_control.py where 36-token
   answers repay a 1.4 s catch-up goes from 1.15x to 1.10x of plain decoding (twice over: 1.00x, so not 2). Tried and
   left out: a carried choice that beats plain decoding by less than 1.25x or 1.5x waiting for the new sequence's own
   confidences (qa 0.931 / 0.928 on the EPYC's costs, bf16 qa 1.019 -> 1.006 / 0.944): qa's first answer after the
   sums drafts on a carried rate that the last sum earned, which nothing before its own steps can refute.

29. A prompt's agreement as a prior (``prompt_prior_width``, 0.05; :meth:`BudgetController.observe_prompt`). A
   short answer after long, well-drafting ones lost on its first 1-3 drafted steps, taken on the carried samples of
   the last text (design 28's closing note): nothing of its own refutes them before those steps. Its prompt does:
   the share of prompt positions where the draft's argmax equals the target's has Spearman 0.81 with N = 16's speed
   over plain decoding across sweep 13's 30 first-turn prompts (qa 0.44-0.49, sum 0.56-0.60, humaneval 0.75-0.81;
   ``scripts/prompt_agreement.py``; over 64 positions spread over the prompt, what the loop measures, 0.68). Where
   the first step would draft (:meth:`prompt_agreement_due` asks :meth:`next_budget` of a copy), the decoding loop
   measures it before that step (both output heads over those 64 rows only; the draft forwards its prompt then, as
   that first step would have), and the controller compares it with the earlier sequences of this process (and of
   the controller memory): each one that was told its agreement and committed at least :data:`PRIOR_MIN_TOKENS`
   from drafted steps left a pair (agreement, its drafted steps' tokens/s over plain decoding's modelled rate).
   When at least :data:`PRIOR_NEIGHBOURS` earlier prompts within ``prompt_prior_width`` of this one drafted, on
   average, slower than plain decoding, the carried acceptance samples and the last text's confidences are dropped,
   the choice is plain decoding and no scheduled probe runs at once: the sequence drafts once its own text predicts
   a win (design 12) or at the schedule's next trial. The speed is measured on this machine, so a prompt kind
   starts plain where drafting lost (the AVX2 EPYC in float32) and keeps drafting where it paid (bf16 on the Xeon:
   never started plain in the replay); design 32 says which sequences pay the heads. Sweep 13 replayed (8 seeds,
   the heads charged at 4 ms a position on the EPYC, 1 ms on the Xeon): float32 on the EPYC, qa 0.934 -> 0.967 of the best fixed budget (plain
   included), alpaca 0.991 -> 1.003, all 0.993 -> 0.998, sum unchanged (0.941); bf16 on the Xeon within 0.003 on
   every dataset (all 0.997 -> 0.996). Tried and left out: a least-squares line from agreement to speed through all
   pairs (sum 0.941 -> 0.926, it started sum prompts plain on qa's evidence); the agreement over every prompt
   position (its heads cost 2.8 s on a 700-token sum prompt there); asking whenever a trial was due (it paid long
   prompts' catch-ups that the controller would have declined).

30. A prompt far below the evidence (``prompt_gap``, 0.15; :data:`FAR_VERIFY_RATIO`). Design 29 acts only once two
   earlier prompts near this one lost; the first chat answer after code has none and drafted on code's carried
   samples: in a timed float32 run on the EPYC (humaneval then qa) the first qa answer ran three trees of 20-24 nodes
   that accepted little, 0.69x of plain decoding, and qa as a whole 0.86x. Its prompt said so beforehand: the draft
   agreed with the target on 47% of it against 75-80% on the code prompts whose answers left the samples. When the
   new prompt's agreement lies more than ``prompt_gap`` below that of the last sequence that taught the prior (the
   source of the carried samples, unless later ones drafted without being measured), too few earlier prompts are
   near it for design 29 to judge and none of those drafted at least as fast as plain decoding, and verifying the
   first step's tree (the carried choice, or the first probe's size from plain) costs at least
   :data:`FAR_VERIFY_RATIO` plain verifies (1.5; 1.75 since design 34) (on the EPYC in float32 1.8x at 4 nodes, 2.9x at 32; bf16 on the Xeon
   1.0-1.15x, the H200 1.05-1.2x), the sequence starts as design 29's losing neighbours make it start:
   plain, the carried samples and the last text's confidences dropped, and so are the lengths of the last answers
   (design 9's estimate of the tokens left, which let the second qa answer run a trial that lost 10%: code's
   answers ran to the token limit). Where verification is flat a wrong tree costs little beside what the carried
   samples win: without the steepness condition the rule cost bf16's qa after humaneval 0.978 -> 0.919 and sum
   0.993 -> 0.971 of the best fixed budget. Sweep 13 replayed on the EPYC's float32 costs (8 seeds, the heads
   charged at 9 ms a position as measured there, ``scripts/replay_positions.py --order``), over plain decoding: qa
   right after humaneval 0.931 -> 0.967, after gsm8k 0.936 -> 0.988, mt_bench after humaneval 1.117 -> 1.127, sum
   after humaneval 1.037 unchanged, alpaca after humaneval 0.997 unchanged and after gsm8k 0.996 -> 0.974 (its first
   answer gains, the second, 20 tokens, runs a scheduled trial it did not run before); the sweep's own order, and
   every order on the bf16 and H200 costs, unchanged. ``prompt_prior_width`` = 0 turns design 30 off with design 29.

32. The heads where an agreement can change the start (:meth:`_prior_can_start_plain`; 31, a lower anchor, was tried
   and reverted: docs/BENCHMARKS.md section 5). Design 29 asked every
   sequence for its agreement until 8 measured prompts had all drafted faster than plain decoding. On the EPYC with
   AVX512-BF16 the two output heads cost 2 ms a prompt row (target 0.9-1.7, draft 0.7-1.0: ``prefill_logits``
   against ``prefill``), 0.08 s on a 39-token QA prompt, 4% of its 17-token answer, and there no agreement could
   have started a sequence plain: no measured prompt had lost, and the first step's tree verifies at under
   :data:`FAR_VERIFY_RATIO` plain verifies, so neither design 29's losing neighbours nor design 30 can act. Now a
   sequence pays the heads when an agreement could change its start (the measured prompts near some agreement drafted,
   on average, slower than plain decoding, or the first tree verifies at :data:`FAR_VERIFY_RATIO` or more), and otherwise only every
   :data:`PRIOR_SAMPLE_EVERY`-th sequence, from the first on, so that pairs still gather for when the machine or the
   text turns; a lone loss among faster neighbours cannot start a prompt plain and does not count. Sweep 13 replayed
   (8 seeds; the EPYC's heads now charged at the 2 ms measured): bf16 on the EPYC,
   mt_bench 0.981 -> 0.985 and alpaca 0.958 -> 0.962 of the best of N = 8, 12, 16, all 0.983 -> 0.985; the Xeon
   0.996 -> 0.997; the AVX2 EPYC in float32 unchanged on every dataset (its verify curve is steep: every sequence
   still measures). Tried and left out: measuring only once a pair exists that some agreement could act on (design
   30 needs one): on the float32 costs qa 0.962 -> 0.987 of plain decoding but alpaca 1.001 -> 0.991 and humaneval
   1.529 -> 1.516, as the first sequences of a fresh process then taught the prior nothing.

33. Verify costs by context (:meth:`CostCurve.read_at`, ``StepRecord.context_tokens``, ``next_budget``'s
   ``context_tokens``). A tree's verify attends to every cached token, so its cost grows with the context: on the EPYC
   with AVX512-BF16 in bf16 the fixed budgets' steps of two sweeps took a median 179-188 ms at 16 nodes over contexts
   under 150 tokens and 191-209 ms over 600 or more (8 nodes 140-154 / 154-171 ms; a plain step no dearer), about
   2 us a node per context token; one trace read 0.157-0.164 s at 16 nodes over a QA prompt against 0.21 s over a
   summary. The curve kept each size's last samples whatever context they came from, so after the summaries the sizes a
   QA answer did not run again kept their long-context costs while the ones it ran were measured cheap, and the
   relative costs that choose N were off for the whole of the short answers. The loop now tells the controller the
   target's cache length at each step; the verify curve estimates a context slope (Theil-Sen over pairs of samples of
   one size of at least :data:`CONTEXT_MIN_SIZE` nodes whose contexts lie at least :data:`CONTEXT_MIN_SPAN`
   node-tokens apart) and, read at the coming step's context (re-read once it moved :data:`CONTEXT_STEP_TOKENS` tokens
   or a tenth), moves every sample there. Where a context costs nothing the pairs differ by timing noise, and one
   noisy sample at another context tips many pairs at once: the slope is used only with :data:`CONTEXT_MIN_PAIRS`
   pairs, :data:`CONTEXT_AGREEING` of them finding the longer context dearer, and a difference over the upper
   quartile of their spans of at least :data:`CONTEXT_MIN_EFFECT` of their seconds. Sweep 13 replayed with the EPYC's
   costs made context-dependent (2 us a node per token about forward_costs' 200-token cache; 24 seeds;
   ``scripts/replay_positions.py --blind-context`` for before): the sweep's order all 0.981 -> 0.982 of the best of
   N = 8, 12, 16, qa 0.949 -> 0.989 (mean 0.955 -> 0.975), the other datasets within 0.007; sum then qa, qa 0.956 ->
   0.978. At 4.5 us (``--context-slope 4.5e-6``) all 0.982 -> 0.984, alpaca 0.960 -> 0.966, gsm8k 0.973 -> 0.981, sum
   then qa's qa 0.942 -> 0.968. The replays without a context cost (the Xeon's, the AVX2 EPYC's float32) are unchanged
   but one Xeon qa (1.015 -> 1.011): the guards hold the slope at 0 there. Without the last two guards the estimate
   found a context cost in float32 timing noise and cost alpaca 0.9% there and 0.8% on the Xeon.

34. Design 30's steepness read where the first step runs (``prompt_agreement_due`` and ``observe_prompt`` take the
   first step's ``context_tokens``; :data:`FAR_VERIFY_RATIO` 1.75, was 1.5). Design 30 asked whether the first tree
   verifies at 1.5 plain verifies or more with the verify curve still read where the last sequence ended (design 33):
   after a 918-token summary prompt and its 128-token answer, the next summary (a 422-token prompt whose agreement, 0.39,
   lay 0.3 below the last measured one) read 16-20 nodes at about 1.6 plain verifies, started plain (16 plain steps, then
   a climb from a trial of 4) on the EPYC with AVX512-BF16, where N = 8-16 ran it at 1.7-1.9x plain decoding (timed
   ``--repeats 3`` run, docs/BENCHMARKS.md section 5: 12.7 s against 11.1-11.8 s at a fixed N), and the climb's leans
   carried into the first QA answer, which opened at 24 nodes and leaned to 32 (4.05 s against 3.09 at N = 12). The
   costs are now read at the new prompt's context, and the ratio is 1.75: bf16 on that EPYC verifies 16 nodes at 1.25-1.4
   plain verifies and 32 at 1.6 over short contexts, float32 on the AVX2 EPYC 4 nodes at 1.8 and 16 at 2.2 (the rule's
   case), the Xeon and the H200 under 1.2. Replays (16 seeds, median): sum then qa on the EPYC's bf16 costs qa 0.914 ->
   0.917 (at 4.5 us a node per context token 0.918 -> 0.925), sweep 13's order 0.984 -> 0.985, the AVX2 EPYC's float32
   orders (humaneval then qa or sum, all) unchanged. Tried in the same replays and left out: keeping a carried choice
   above the anchor, or a lean above it, out of a new sequence until its first 1-3 drafted steps (sum then qa, qa 0.917 ->
   0.928-0.942; sweep 13's alpaca 0.967 -> 0.958-0.963 on the EPYC, 0.972 -> 0.934-0.968 on the Xeon); and a second
   condition on a 4-node tree's verify (it is interpolated where small trees never ran: the AVX2 humaneval then qa fell
   0.967 -> 0.939).

35. The prompt sample backs off (:data:`PRIOR_SAMPLE_MAX`, 32). Design 32's every-4th sample is a cost where no agreement
   can change a start: in sweep 25 (bf16 on the EPYC with AVX512-BF16, docs/BENCHMARKS.md section 5) a measured QA or
   Alpaca prompt of 36-43 tokens took 0.38 s before its first step against 0.22-0.23 s for the fixed budgets (about
   0.05 s of it the draft's prompt forward, which the first step would have run), 5-7% of a 17-20-token answer, on a
   fifth of those requests; in a server it would be a quarter of all requests for as long as it runs. Samples are now
   counted from the last measured prompt, and each one whose sequence then drafted at :data:`NEW_COMMAND_MARGIN` x
   plain decoding or more doubles the interval to the next (4, 8, 16, then 32 sequences: 0, 4, 12, 28, 60, 92); one
   that drafted slower sets it back to 4, and where an agreement could act (losing neighbours, a steep first tree)
   every sequence is measured as before. Replays (16 seeds, median; ``scripts/replay_positions.py``): sweep 13 on the
   EPYC's bf16 costs all 0.985 -> 0.986 of the best of N = 8, 12, 16 (qa 0.996 -> 1.004, humaneval 1.010 -> 1.013,
   gsm8k 0.977 -> 0.979, the rest within 0.002), the Xeon's all 0.996 -> 0.997, the AVX2 EPYC's float32 unchanged (its
   verify is steep: every sequence measures); the two 10-15-sequence worlds of sweep 24 unchanged (only their 8th
   sequence is spared). Never sampling there read all 0.987: the back-off keeps most of that while pairs still gather.

(36, tried and reverted, docs/BENCHMARKS.md section 5: where 16 nodes verified at 1.15-1.75 plain verifies, the rung
below the anchor admitted as an anchor too. The replays of this CPU's own texts gained (sum then qa, qa 0.917 ->
0.968; the tree texts 0.962 -> 0.974), but a timed sweep read 0.965 of the best fixed N overall (sweeps 23-25: 0.981-
0.988): its choices moved from 16 to 12 on code and chat, where N = 16 was that run's best column, as with design 31;
a timed sum-then-qa run read qa 0.922 but sum 0.939, where design 34 read 0.877 and 0.991 pooled over two runs.)

38. A measured prompt's draft forward is a catch-up sample (:meth:`BudgetController.observe_catch_up`). Measuring a
   prompt's agreement (design 29) forwards the prompt through the draft LM before the first step, which then has
   nothing to catch up; where verification is steep every prompt is measured (design 30 could act), so a run of code
   requests that drafted from their first step on taught the catch-up curve only the few tokens of plain steps,
   which a CPU forwards at about the cost of one row. Read from those, a 700-token news prompt's catch-up cost about
   nothing: at temperature 1 on the AVX2-only EPYC in float32 (docs/BENCHMARKS.md section 5, medians of three runs)
   the first CNN/DM request after five HumanEval ones would draft on code's carried choice, so its prompt was
   measured (the draft's forward over 709 tokens, about 5 s), it started plain all the same, and it read 0.85x of
   ``ar``. The loop now reports that forward's seconds; the curve then charges a long prompt what the measured prompts
   cost per token, and the first step waits for the new text's own confidences (design 25) with nothing measured.
   tests/test_control.py: code with every prompt measured, then a 700-token prompt: measured before, plain and
   unmeasured now. Timed since (the same bench): that request 0.99x, sum 0.80x -> 0.98x, every sum step plain.

40. That sample is the decoder stack alone (:func:`talon_sd.decoding._prefill`; the loop, not this package). Design 38
   timed the draft's prompt forward together with its output head over the (up to 64) agreement rows, which a step's
   catch-up never runs; on the AVX2-only EPYC in float32 the head over 50 rows of a 151,936-token vocabulary added
   half to nine tenths of the 50-token forward's 0.35 s (0.51-0.67 s in all), and the curve, linear past its largest
   bucket, carried that into every longer catch-up: HumanEval's 166-token prompt after two chat requests was charged
   2.2 s at its first step (3.3 s without the bench's warm-up; its forward: 0.96 s), above what a trial may spend,
   and every step of the code request ran plain ("trial-catch-up"). The loop now runs the drafter's catch-up (:meth:`talon_sd.drafters.Drafter.catch_up`, timed
   as a step's) and then asks for the logits at the agreement rows from that forward's kept output (on CUDA the
   decoder-stack prefill now waits for the device, so a step's catch-up is timed apart there too). A trace of the
   bench's order (8-token warm-up, mt_bench 0, alpaca 0, then HumanEval 1 and 2): the sample 0.38 s for 50 tokens
   (0.67 s before), HumanEval 1 drafted 114 forwards in 31.4 s where it had run plain in 41-48 s. Timed
   (docs/BENCHMARKS.md section 5, six datasets greedy in the bench's order): humaneval 0.98x -> 1.18x of ``ar``, but
   gsm8k 1.04x -> 0.85x: trials reach it too, its drafting is about break-even on that host, and a plain rate measured
   in a slow spell, re-measured only every 64 steps (design 13), kept its requests drafting; not yet addressed.

42. Plain decoding's cost at the drafted steps' host speed (``paired_plain``; :class:`CostCurve`'s ``paired`` size). Every
   drafted rate is judged against rate(1), and while a drafted budget is the choice verify(1) is measured once in 64
   steps (design 13), so its fit reads its newest 3 samples (design 21), up to 192 steps old, beside drafted sizes
   measured in the last 32. The machine runs in spells (on the AVX2-only EPYC a plain step took 0.23-0.39 s within
   minutes): in the float32 bench of design 40 gsm8k's plain rate fell from 3.5-3.8 to 2.92 tok/s in a slow spell and
   stayed there while drafted steps of a fast spell read 3.6-3.7, and gsm8k, about break-even there, drafted at 0.85x
   of ``ar``. Each plain sample now keeps the drafted verify samples added within :data:`PAIR_STEPS` (4) steps before
   and after it; while fewer than :data:`RECENT_SAMPLES` plain samples lie within the verify curve's horizon, verify(1)
   is the median over its newest :data:`PAIRED_KEPT` (9) samples with :data:`PAIR_MIN` (2) such neighbours of (its
   seconds) x (the median over its neighbours of the drafted sizes' fit at the neighbour's size / the neighbour's
   seconds), moved to the read context (design 33), weighed in the fit as the samples it replaces: the same machine
   speed on both sides of the comparison. Where plain steps are frequent (a plain choice) they are fitted as measured:
   a first version that always paired read verify(1) from the few samples beside trials and was noisier there (three
   seeded worlds of tests/test_control.py changed their paths; a 64-step run of exact plain samples was outvoted by
   three paired ones). ``scripts/controller_scenarios.py`` (16 seeds): every scenario within 0.005 of before in median
   but the Intel bf16 chat (0.959 -> 0.964) and its slow-spell code (0.974 -> 0.985). Real pair, float32 on the AVX2-only
   EPYC, ``scripts/ab_controller_settings.py --dtype float32 --dataset gsm8k --limit 5 --set paired_plain=false``
   (both variants side by side, order rotated): the always-paired version 0.999x of ``ar`` against 0.912x without
   pairing in the same run (all plain against 16-20-node trees), this one 0.951x against 1.009x (now the paired side
   drafted and the other went plain); on humaneval (always paired) 1.257x against 1.255x. At break-even which side a
   run lands on is decided by the noise of its first requests, and pairing does not change that. Tried with it and
   left out: while the choice beats plain decoding by less than 1.25x, a plain step every 16 or 8 steps instead of 64
   (design 41 again): within the seeds' noise in break-even float32 worlds with 32-step slow spells.

44. The prompt measure is the draft's mean probability of the target's argmax (:func:`talon_sd.decoding._prefill`; the
   loop, not this package, which takes any agreement in [0, 1]). Design 29's share of equal argmaxes overlapped between
   sweep 13's gsm8k prompts (0.61-0.75) and its HumanEval prompts (0.75-0.80), where drafting lost and won on the
   AVX2-only EPYC in float32, so a code prompt could start plain on math's evidence; the mean probability, read from the
   same 64 rows of the same logits, separates them (0.44-0.51 against 0.61-0.73). Replayed on that host's costs
   (``scripts/replay_positions.py --hardware avx2-fp32-steep --measure soft``, 4 seeds, the bench's order): humaneval
   1.088 -> 1.113 of plain decoding, qa 0.966 -> 0.980, the rest unchanged (all 1.002 -> 1.004); on the older
   ``avx2-fp32`` profile all 0.994 either way (qa 1.062 -> 1.073, gsm8k 0.975 -> 0.971); on bf16 EPYC costs, where
   design 29 never acts, identical. ``prompt_gap`` (design 30) kept at 0.15. Controller memories written with the
   old measure are not read (:data:`talon_sd.controller_memory.MEMORY_FORMAT` 2). Not yet timed on the real pair.

45. A fall starts the trial interval over (``reopen_on_fall``). Trials that lost above a large choice double the
   interval to ``max_probe_interval`` (64 steps); when a poor stretch then pulls the choice down to a smaller drafted
   budget, the probes above it were last measured on the text before the fall, steps at the small choice inform only
   budgets up to it, and the lean (design 17) reads the rung's stale rate, so nothing re-measured the budgets above:
   sweep 28's mt_bench request 84/1 ran N = 3 for 69 of its 70 steps, and replays showed the same (a 70-step turn
   at N = 3, 13% slower than N = 12). Now a fall to a drafted budget sets the interval back to
   ``min_probe_interval`` (a trial from it probes its lean rung, design 17; each trial that loses doubles the interval
   again, and the exploration share of design 8 still bounds their cost). Replays (``scripts/replay_positions.py
   --hardware epyc-bf16 --bar 8,12,16 --fixed 8,12,16 --seeds 16``, auto over the best of N = 8, 12, 16, median):
   sweep 13's texts all 0.987 -> 0.989 (worst seed 0.972 -> 0.985; mt_bench 0.985 -> 0.991, qa 1.000 -> 0.985), the
   sweep-24 tree texts 0.962 -> 0.977 (mt_bench 0.964 -> 0.980), sum then qa 0.977 -> 0.973; the Xeon's bf16 costs
   0.997 -> 0.999, the H200's 0.992 -> 0.994 (24 seeds), the AVX2 EPYC's float32 unchanged (it runs plain). Only
   falls below the lean floor (8): sweep 13 0.988, tree texts 0.973: not kept.

46. A carried drafted choice is checked against a plain step on the new text (``plain_check_steps``). A sequence that
   opens on the last one's drafted choice judges it against rate(1), and while a drafted budget is the choice plain
   steps are rare (design 13), so rate(1) can be a plain cost measured on another text in another spell of the
   machine: on the AVX2-only EPYC in float32 (talon bench, 3 timed runs per turn) mt_bench 82/1 opened on the 16-20
   nodes carried from 81/2, where they had won, and drafted 29 steps at 3.6 tokens a step, about 0.47 s a token,
   against plain steps of 0.37 s on that text: 60.6 s against ``ar``'s 48.2 s, the choice falling only when the
   request was nearly done. The controller's own rates cannot tell this case apart (a stale rate(1) is what makes the
   drafted choice look 1.3-1.5x faster than plain decoding, as a real win looks). So where verification is steep (the
   choice's tree costs :data:`CHECK_VERIFY_RATIO` plain verifies or more, read against the fastest plain sample kept:
   a float32 CPU without AVX512 or with torch's default kernels, where drafting is near break-even and the plain rate
   decides; not bf16 or a GPU, where an unconditional check cost 1-1.5% of short code requests for nothing in the
   synthetic worlds of ``scripts/controller_scenarios.py``), a sequence that opened on a carried drafted choice runs
   one plain step (``plain-check``) after ``plain_check_steps`` of its own drafted steps, unless it ran a plain step
   already. If its drafted steps' measured rate, the catch-up left out, is more than :data:`CHECK_MARGIN` below that
   plain step's, the acceptance samples are dropped (as where design 29 starts a prompt plain; capped to one step's
   weight instead, the few own samples still read a 3-node tree faster than plain and the choice came straight back),
   verify(1) and the plain overhead keep only that newest sample (the older ones were measured elsewhere) and the
   choice is plain decoding, its probe schedule started over: trials and design 12's predictions take it back to
   drafting where this text lets them. A check that finds drafting fast enough changes nothing but one plain step, a
   fresh sample of verify(1). Synthetic worlds on the AVX2 curves: chat after code whose plain steps ran 1.25x slow
   (every drafted N loses more than 10% to plain decoding; 12 seeds) 0.858 -> 0.961 of plain decoding (the check left
   drafting in 8); 48-token code answers at 1.38x plain after code, 16 seeds: a false leave in 1 (after 3 steps with no
   margin 4, with 5% 2, with 10% 0; after 5 steps with 10% 1); the Intel float32 T = 1-like world (drafting 1.1x plain,
   24 seeds) lost 1% in mean after 3 steps and nothing after 5, hence 5 and 10%.

47. A run of own steps that accepted nothing releases the carried samples (design 8's change point, one-sided). Design
   8's z-test reads the carried samples' spread of committed tokens, which is wide where a text drafts well in
   stretches (sum at N = 24 on the real pair: 1 to 15 tokens a step), so a short answer on which the draft is never
   right drafted 3-4 steps at the carried choice before the choice fell: on the AVX2-only EPYC in float32 with the
   int8 draft (talon bench, 3 timed runs a turn), qa 321 opened on sum's 24 nodes and ran four 24-node steps, three
   of which accepted nothing, at about 1.3-1.75 s each against a 0.48 s plain step; the request ran at 0.73x of
   ``ar``. Now, while every own drafted step of a new sequence accepted nothing at the largest budget they all inform,
   the carried samples' weighted share q of steps that accepted nothing there (with half a step's pseudo-count over
   one step more, so q > 0) makes a run of k such steps as likely as q ** k on the carried text; below
   ``release_nothing_p`` (5%) the samples are released as in design 8. Two steps release where fewer than 22% of the
   carried steps accepted nothing. Synthetic (the world of tests/test_control.py's test: easy and middling stretches
   on the AVX2 curves, then a 24-token answer the draft never gets; 16 seeds, the test runs 8): 38 -> 27 drafted steps
   in all, 0.831 -> 0.871 of plain decoding; on unchanged text no release at any threshold up to 10%.
   ``scripts/controller_scenarios.py`` (8 seeds) unchanged but for bf16 chat (mean 1.394 -> 1.396) and the Intel bf16
   chat with slow spells (mean 0.992 -> 0.994, worst seed 0.982 -> 0.979); replays of the recorded trees unchanged on
   the AVX2 costs (float32 or int8 draft) and within noise on the EPYC's bf16 costs (all 0.982 -> 0.983). 2% changed
   the same synthetic world less (32 drafted steps).

51. An early check where the new text already drafts clearly slower (``early_check_steps``). Design 46's check waits
   for 5 own drafted steps, and design 47 acts only while every own step accepted nothing; a short answer on which the
   draft is right now and then pays the carried choice for four or five steps. On the AVX2-only EPYC in float32 with the int8
   draft (docs/BENCHMARKS.md section 5, medians of three timed runs) qa 321 (24 tokens) opened on sum's 16-20 nodes,
   two of its five drafted steps accepted 2 tokens and the rest none, about 1 s lost a step: 0.72x of ``ar``, the whole
   of qa's shortfall (0.91x). Now the check's plain step also comes at or after ``early_check_steps`` (2) own drafted
   steps (before 5) while their measured rate (catch-up left out) is more than :data:`EARLY_CHECK_SHORTFALL` (20%)
   below rate(1); such an early check leaves drafting only if their rate is that much below its plain step's, and when
   it keeps drafting its plain step judges the drafted steps again, with :data:`CHECK_MARGIN`, at the fifth. A check
   that goes plain (early or not) also counts as a trial's end for design 12: a predicted trial waits
   ``min_probe_interval`` steps. Timed without that last part (section 5), the check moved qa 321 from five drafted
   steps to two, but design 12 predicted a 4-node trial at the very next step, from confidences that were still
   mostly sum's, and its three steps lost most of what the check had saved (0.78x of ``ar``).
   Two steps cannot tell a poor text from a good text's poor opening: the trade is a loss below plain decoding (what
   the check removes) against a speed-up given up (what a false leave costs, until trials win it back). Replays of the
   real pair's recorded trees (``scripts/replay_positions.py``, 8 seeds, median, worst seed in brackets), on the AVX2
   int8-draft costs: this CPU's texts in the bench's order qa 1.061 -> 1.154 (0.946 -> 1.120), the same sum then qa
   1.055 -> 1.126, sweep 13's sum then qa 1.134 -> 1.167, sweep 24's sum and qa 1.132 -> 1.136, every other dataset
   unchanged; on the older AVX2 float32 costs within 0.02 (humaneval 1.548 -> 1.529), on the steep profile qa 0.945 ->
   0.979; on the EPYC's float32 default kernels qa 0.937 -> 0.948, sum 0.999 -> 0.983, gsm8k 1.218 -> 1.204; on bf16
   costs identical (verification is not steep: no check runs). ``scripts/controller_scenarios.py`` (16 seeds):
   unchanged but the Intel float32 T = 1-like code (mean 1.073 -> 1.063 of plain). The adverse synthetic case
   (tests/test_control.py): a text that opens each request with two middling steps, on which those steps lose to plain
   decoding, falsely leaves in 3 of 16 requests (mean 1.145 -> 1.086 of plain; those three read 0.93-1.09), while a
   24-token answer the draft gets 40% right drafts 11 steps instead of 19 over 8 requests (0.876 -> 0.923 of plain).

53. Stale drafted sizes read at a plain spell's speed (``follow_plain``; :class:`CostCurve`'s ``follow``), the mirror
   of design 42. ("52", a bet's prediction scaled by what drafting then measured, was tried and left out:
   docs/BENCHMARKS.md section 5.) In a spell of plain steps the drafted sizes are not measured, so each one's fit keeps
   its newest samples from wherever it last ran. On the AVX2-only EPYC in float32 (a step trace at temperature 1,
   section 5) plain decoding read 3.46 tok/s over chat contexts and 2.70 after a 709-token summary prompt's own plain
   steps, while the 8- and 16-node rates carried from the chat (3.47) were never re-measured. So the choice went to
   16 nodes on a comparison of two contexts. Now, while at least :data:`RECENT_SAMPLES` plain samples lie within the
   verify curve's horizon and every drafted size has fewer, each drafted size moves by (verify(1) now) / (verify(1)
   where they were measured), clamped to [1/2, 2] (:data:`PLAIN_FOLLOW_MAX`). The latter is read from the plain
   samples that had drafted neighbours of those sizes (design 42's pairs), counting only neighbours within
   :data:`PLAIN_FOLLOW_CONTEXT` (128) context tokens of the plain sample: a new sequence's first plain steps lie
   beside the last sequence's drafted steps in add order, and they would read the drafted sizes at the new speed
   already. Two guards keep timing noise out:
   - a factor within :data:`PLAIN_FOLLOW_BAND` (10%) of 1 moves nothing;
   - with any drafted size fresh, nothing moves. A first version moved only the stale sizes. In the bf16 replays it
     reordered them against the fresh ones by noisy ratios of 0.95-1.10, and sweep 13's qa fell from 0.972 to 0.954
     of the best fixed N (16 seeds).
   A version without the band tipped break-even choices both ways on noise. In design 27's test it left 2 of 8 code
   commands on a drafted choice where 4 or more had been.
   Replays of the recorded trees and the other scenarios of ``scripts/controller_scenarios.py`` (24 seeds) are
   unchanged: their costs have no context-dependent plain step and no spell that long. Its new scenario is a
   synthetic temperature-1 summary world: three chat requests carried into three 700-token-prompt requests (every
   verify 1.3x, the draft right 60% of the time, drafting 0.87x of plain at N = 8). There (12 seeds) the summaries
   read 0.955 -> 0.958 of plain decoding (mean), worst seed 0.923 -> 0.945. The rest of that world's loss is the
   first summary's bet on its own confidences (designs 25, 28), not this comparison.

54. A trial from plain counts its catch-up before it starts (``regret_catch_up``; reason ``trial-regret``). Design 8
   bounds what trials lose to ``exploration_share`` (5%) of the observed seconds, but it checks only the losses
   already counted. A trial from plain decoding also pays the draft's catch-up over every token it has not seen. In a
   new sequence that is the whole prompt: on the AVX2-only EPYC with the int8 draft, a 664-token summary prompt costs
   about 2.7 s, 4-5% of a 128-token answer there. In the third temperature-1 reading of sum (docs/BENCHMARKS.md
   section 5) such a trial at request 242's first two steps accepted one token in two steps, and that request decoded
   at 0.86x of ``ar``'s seconds a token (3.3 s of draft time). Design 11's bound on a trial's catch-up
   (``trial_cost_share``, itself 5% of the rest's plain seconds) let it through. Now, from
   plain, a due trial waits while the seconds lost so far plus its catch-up exceed the share, unless the sequence's
   own text predicts a win that pays the catch-up back twice over (design 15's margin) or the rest's length is
   unknown (nothing to weigh it against: as before). From a drafted choice the catch-up is paid by the choice's own
   steps and is not the trial's cost. The observed seconds level off at about 92 steps' worth (half-life 64), so the
   share admits at most about 4.6 plain steps' seconds of catch-up: on that host (0.34 s a plain step, 4 ms a
   catch-up token) a prompt of more than about 400 tokens is tried from plain only on a predicted win, and a plain
   spell's own tokens add to the catch-up the same way. Measured against
   ``--set regret_catch_up=false``:
   - ``scripts/controller_scenarios.py --seeds 12``. Its new world is five 700-token summaries from a fresh
     controller at the int8 draft's measured 4 ms catch-up a token. There summaries 2-5 read 0.953 -> 0.972 of plain
     decoding (median; mean 0.955 -> 0.971). The "fp32 code" worst seed 0.965 -> 1.055 and "fp32 mid" 0.973 -> 0.976
     (median). Every other scenario is within 0.004.
   - Replays (8 seeds). The AVX2 int8 greedy texts, sweep 13 on the bf16 EPYC's and the Xeon's costs, and sum then qa
     are unchanged. On the older ``avx2-fp32`` costs gsm8k reads 1.183 -> 1.192 of plain and humaneval 1.551 -> 1.545.
     On ``avx2-fp32-steep`` (24 seeds) all reads 1.003 -> 1.004, with qa 0.966 -> 0.957 (median; mean 0.964 ->
     0.962): a trial blocked at one request's end starts in a later one.
   - Tried and left out: an exploration share of 3% as well. Code drafted less: the steep replay's humaneval fell
     1.107 -> 1.053, and the chat-then-summaries scenario's worst chat seed 1.108 -> 0.989.

Not modelled: keep_growing looks one layer ahead;
a step stopped early by keep_growing is taken to be what every larger budget would have built (true
up to keep_growing's own dependence on the budget).

Settings are a frozen :class:`ControllerSettings`; bad values raise
:class:`~talon_sd.errors.TalonError` naming the field. Records are checked on construction
(inconsistent lengths raise ValueError).
"""

from __future__ import annotations

from .records import (
    PrefixOutcome,
    StepRecord,
    expanded_positions,
    fully_expanded_positions,
    informs,
    is_layered,
    prefix_outcome,
)
from .costs import (
    CONTEXT_AGREEING,
    CONTEXT_MIN_EFFECT,
    CONTEXT_MIN_PAIRS,
    CONTEXT_MIN_SIZE,
    CONTEXT_MIN_SPAN,
    CONTEXT_STEP_TOKENS,
    CostCurve,
    CostPrior,
    PAIRED_KEPT,
    PAIR_MIN,
    PAIR_STEPS,
    PLAIN_FOLLOW_BAND,
    PLAIN_FOLLOW_CONTEXT,
    PLAIN_FOLLOW_MAX,
    RECENT_SAMPLES,
)
from .acceptance import (
    CHILD_PRIOR_SHARE,
    CONFIDENCE_EDGES,
    Calibration,
    DEFAULT_CALIBRATION_EDGES,
    FOLLOW_PRIOR_SHARE,
    Predictability,
)
from .settings import (
    ANCHOR_GAP,
    CHECK_MARGIN,
    ControllerSettings,
    DEFAULT_LADDER,
    EARLY_CHECK_SHORTFALL,
    FAR_VERIFY_RATIO,
    LEAN_FLOOR,
)
from .controller import (
    BudgetController,
    CATCH_UP_MARGIN,
    CHECK_VERIFY_RATIO,
    LENGTHS_KEPT,
    NEW_COMMAND_MARGIN,
    OWN_CONFIDENCES,
    PREDICTED_WIN,
    PRIOR_MIN_TOKENS,
    PRIOR_NEIGHBOURS,
    PRIOR_PAIRS,
    PRIOR_SAMPLE_EVERY,
    PRIOR_SAMPLE_MAX,
    REASONS,
    RELEASE_Z,
    SHAPE_PRIOR_STEPS,
)

__all__ = [
    "PrefixOutcome",
    "StepRecord",
    "expanded_positions",
    "fully_expanded_positions",
    "informs",
    "is_layered",
    "prefix_outcome",
    "CONTEXT_AGREEING",
    "CONTEXT_MIN_EFFECT",
    "CONTEXT_MIN_PAIRS",
    "CONTEXT_MIN_SIZE",
    "CONTEXT_MIN_SPAN",
    "CONTEXT_STEP_TOKENS",
    "CostCurve",
    "CostPrior",
    "PAIRED_KEPT",
    "PAIR_MIN",
    "PAIR_STEPS",
    "PLAIN_FOLLOW_BAND",
    "PLAIN_FOLLOW_CONTEXT",
    "PLAIN_FOLLOW_MAX",
    "RECENT_SAMPLES",
    "CHILD_PRIOR_SHARE",
    "CONFIDENCE_EDGES",
    "Calibration",
    "DEFAULT_CALIBRATION_EDGES",
    "FOLLOW_PRIOR_SHARE",
    "Predictability",
    "ANCHOR_GAP",
    "CHECK_MARGIN",
    "ControllerSettings",
    "DEFAULT_LADDER",
    "EARLY_CHECK_SHORTFALL",
    "FAR_VERIFY_RATIO",
    "LEAN_FLOOR",
    "BudgetController",
    "CATCH_UP_MARGIN",
    "CHECK_VERIFY_RATIO",
    "LENGTHS_KEPT",
    "NEW_COMMAND_MARGIN",
    "OWN_CONFIDENCES",
    "PREDICTED_WIN",
    "PRIOR_MIN_TOKENS",
    "PRIOR_NEIGHBOURS",
    "PRIOR_PAIRS",
    "PRIOR_SAMPLE_EVERY",
    "PRIOR_SAMPLE_MAX",
    "REASONS",
    "RELEASE_Z",
    "SHAPE_PRIOR_STEPS",
]
