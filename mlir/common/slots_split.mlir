  // normir common piece: the backward's ${NAME} column sums in shared memory in 16-byte quarters,
  // [k][quarter][tid] (DB_SMEM 2 and 3): each thread its own K x V fp32 slots, which no other
  // thread reads (no barrier). A warp's 16-byte accesses of one quarter are consecutive and hit
  // every bank once; the [k][tid][V] slots of DB_SMEM 1 hit each twice at V = 8. SLOT_Q fp32 a
  // quarter, SLOT_H quarters a chunk; the element loops unroll into register moves (1-D vectors
  // only: n-D ones do not lower here). SLOT_BUF is the slots' memref (static shared memory) or
  // their byte address (dynamic, common/slots_dyn.mlir), SLOT_LOAD / SLOT_STORE the access.
  func.func private @normir_${NAME}_get(%buf: ${SLOT_BUF},
      %k: index, %tid: index) -> vector<${V}xf32> attributes {llvm.linkage = #llvm.linkage<internal>} {
    %c0 = arith.constant 0 : index
    %none = arith.constant dense<0.0> : vector<${V}xf32>
    %s = affine.for %h = 0 to ${SLOT_H} iter_args(%acc = %none) -> (vector<${V}xf32>) {
      %q = ${SLOT_LOAD}
      %next = affine.for %i = 0 to ${SLOT_Q} iter_args(%a = %acc) -> (vector<${V}xf32>) {
        %e = vector.extract %q[%i] : f32 from vector<${SLOT_Q}xf32>
        %at = affine.apply affine_map<(d0, d1) -> (d0 * ${SLOT_Q} + d1)>(%h, %i)
        %a2 = vector.insert %e, %a[%at] : f32 into vector<${V}xf32>
        affine.yield %a2 : vector<${V}xf32>
      }
      affine.yield %next : vector<${V}xf32>
    }
    return %s : vector<${V}xf32>
  }
  func.func private @normir_${NAME}_put(%s: vector<${V}xf32>,
      %buf: ${SLOT_BUF}, %k: index, %tid: index)
      attributes {llvm.linkage = #llvm.linkage<internal>} {
    %c0 = arith.constant 0 : index
    %none = arith.constant dense<0.0> : vector<${SLOT_Q}xf32>
    affine.for %h = 0 to ${SLOT_H} {
      %q = affine.for %i = 0 to ${SLOT_Q} iter_args(%a = %none) -> (vector<${SLOT_Q}xf32>) {
        %at = affine.apply affine_map<(d0, d1) -> (d0 * ${SLOT_Q} + d1)>(%h, %i)
        %e = vector.extract %s[%at] : f32 from vector<${V}xf32>
        %a2 = vector.insert %e, %a[%i] : f32 into vector<${SLOT_Q}xf32>
        affine.yield %a2 : vector<${SLOT_Q}xf32>
      }
      ${SLOT_STORE}
    }
    return
  }
