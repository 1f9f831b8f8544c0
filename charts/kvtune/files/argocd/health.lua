-- Argo CD health check for kvtune.io/InferenceDeployment (Lua 5.1, as Argo CD runs it).
-- Argo CD sets the global `obj` (the live object) and reads the returned table `hs`:
-- hs.status is Healthy, Progressing, Degraded or Suspended; hs.message says why.
local hs = {}

local function find_condition(conditions, wanted)
  if conditions == nil then
    return nil
  end
  for _, condition in ipairs(conditions) do
    if condition.type == wanted then
      return condition
    end
  end
  return nil
end

local function describe(condition, fallback)
  if condition == nil then
    return fallback
  end
  local text = condition.message
  if text == nil or text == "" then
    text = fallback
  end
  if condition.reason ~= nil and condition.reason ~= "" then
    return condition.reason .. ": " .. text
  end
  return text
end

local status = obj.status
if status == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the kvtune operator to reconcile this InferenceDeployment"
  return hs
end

-- Status written for an older spec says nothing about the current one.
local generation = obj.metadata.generation
local observed = status.observedGeneration
if generation ~= nil and (observed == nil or observed < generation) then
  hs.status = "Progressing"
  hs.message = "Waiting for the kvtune operator to observe generation " .. tostring(generation)
    .. " (status is for " .. tostring(observed or "none") .. ")"
  return hs
end

local mode = nil
if obj.spec ~= nil and obj.spec.tuning ~= nil then
  mode = obj.spec.tuning.mode
end
if mode == "off" then
  hs.status = "Suspended"
  hs.message = "Tuning is off (spec.tuning.mode: off): kvtune leaves the runtime as it is"
  return hs
end

local degraded = find_condition(status.conditions, "Degraded")
if degraded ~= nil and degraded.status == "True" then
  hs.status = "Degraded"
  hs.message = describe(degraded, "Degraded")
  return hs
end

local progressing = find_condition(status.conditions, "Progressing")
if progressing ~= nil and progressing.status == "True" then
  hs.status = "Progressing"
  hs.message = describe(progressing, "Rolling out")
  return hs
end

local ready = find_condition(status.conditions, "Ready")
if ready ~= nil and ready.status == "True" then
  hs.status = "Healthy"
  hs.message = describe(ready, "Ready")
  return hs
end

-- Not ready, not failing (e.g. a pool waiting for GPU nodes): the operator retries.
hs.status = "Progressing"
hs.message = describe(ready, "Waiting for the Ready condition")
return hs
